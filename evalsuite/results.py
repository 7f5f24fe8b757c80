"""Typed results of the commands: what `diff`, `run` and `verify` return. Each carries its verdict and
headline figures as fields and everything else it measured in `details`; `to_json()` is the result file.
Rendering for people lives in evalsuite/report.py; exit codes in evalsuite/verdict.py."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class _Result:
    details: dict = field(default_factory=dict, repr=False)

    def to_json(self) -> dict:
        """The result file's object: the typed fields first, then the details."""
        head = {k: v for k, v in vars(self).items() if k != "details"}
        return {**{k: list(v) if isinstance(v, tuple) else v for k, v in head.items()}, **self.details}


@dataclass(frozen=True)
class DiffResult(_Result):
    verdict: str = "INCONCLUSIVE"
    engine: str = ""
    model: str = ""
    dtype: str = "float32"
    fault: str | None = None
    prompts: int = 0
    positions: int = 0
    real_mismatches: int = 0
    benign_divergences: int = 0
    prompts_identical: int = 0
    noise_tolerance: float = 0.0
    not_checked: tuple[str, ...] = ()  # blocks a PASS
    checks_not_possible: tuple[str, ...] = ()  # said, blocks nothing
    failing_prompts: tuple[str, ...] = ()  # ids of the prompts with a real mismatch in the main part
    deterministic: bool | None = None  # the engine gave the same answer twice (None: not measured)
    seconds: float = 0.0  # the command's wall time


@dataclass(frozen=True)
class GoldenResult(_Result):
    model: str = ""
    ok: bool = False
    problems: tuple[str, ...] = ()
    summary: dict = field(default_factory=dict)
    not_checked: tuple[str, ...] = ()

    @property
    def verdict(self) -> str:
        """FAIL on any problem; INCONCLUSIVE when something a PASS needs was not checked."""
        return "FAIL" if not self.ok else "INCONCLUSIVE" if self.not_checked else "PASS"

    def to_json(self) -> dict:
        return {"verdict": self.verdict, **super().to_json()}


@dataclass(frozen=True)
class RunResult(_Result):
    verdict: str = "INCONCLUSIVE"
    task: str = ""
    variant: str = ""
    items: int = 0
    model: str = ""
    not_checked: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    settle: str | None = None


@dataclass(frozen=True)
class VerifyResult(_Result):
    verdict: str = "INCONCLUSIVE"
    model: str = ""
    engine: str = ""
    dtype: str = "float32"
    fault: str | None = None
    parts: dict = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
