"""Build an engine by name for a loaded model (the one place the CLI picks an implementation)."""

from __future__ import annotations

from engines.errors import ModelError
from evalsuite.registry import Model

ENGINES = ("reference", "megakernel", "openai")


def make_engine(name: str, model: Model, dtype: str = "float32", fault: str | None = None, remote=None):
    """An object implementing engines.base.Engine. fault: megakernel self-test aid (off by default).
    remote (engines.openai.client.Remote): where the openai engine's server is."""
    if name != "openai" and remote is not None and remote.base_url:
        raise ModelError(f"--base-url applies to --engine openai, not {name}")
    if name == "openai":
        if fault:
            raise ModelError("--fault applies to the megakernel engine only (start `evalsuite serve --fault F`)")
        if remote is None or not remote.base_url:
            raise ModelError("--engine openai needs --base-url URL (e.g. http://127.0.0.1:8000/v1)")
        from engines.openai import OpenAIEngine

        return OpenAIEngine(remote, model.config, model.tokenizer, dtype)
    if name == "reference":
        if fault:
            raise ModelError("--fault applies to the megakernel engine only")
        from engines.reference import ReferenceEngine

        return ReferenceEngine(model.weights, dtype)
    if name == "megakernel":
        from engines.megakernel import MegakernelEngine

        return MegakernelEngine(model.weights, dtype, fault=fault)
    import difflib

    close = difflib.get_close_matches(name, ENGINES, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ModelError(f"unknown engine {name!r}{hint} (expected one of {', '.join(ENGINES)})")


def capability_report(eng) -> dict:
    """What the engine can do, for result files: an API engine's probe findings (ok + detail each),
    or the in-process engine's declared capabilities."""
    if eng.name == "openai":
        return eng.capability_report()
    return {c: {"ok": True, "detail": "declared by the in-process engine"} for c in sorted(eng.capabilities)}


def not_checked(eng, uses_echo: bool) -> list[str]:
    """What could not be shown about this engine and so blocks a PASS: for a server, prompt
    tokenization it could not confirm, and (where echo logprobs are used) an echo path it does not
    state or whose consistency could not be measured. In-process engines: nothing."""
    if eng.name != "openai":
        return []
    return list(eng.prompt_not_checked) + (list(eng.echo_not_checked) if uses_echo else [])
