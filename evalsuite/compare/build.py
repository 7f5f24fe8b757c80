"""A bf16 `diff` also judges the engine's float32 build, when it has one.

A bug in a kernel's code is in both of its builds, but in bf16 a small one can sit far below the rounding that every
bf16 engine shows. `--fault norm_eps` (RMSNorm epsilon 1e-6 for 1e-5) changes a norm's output by about 4.5e-6 relative
where the mean square is near 1, some 1,000x under bf16's rounding (2^-8), and on smollm2-135m no bf16 rule (per
position, drift, logit scale) sees it (measured: quick set, 0 real positions, drift 0.88, scale t +1.0), while the
same engine's float32 build flags 349 of 352 positions (docs/faults.md). So after the bf16 diff the same prompts are
run through the engine built in float32 and judged with float32's bounds: its FAIL is the bf16 run's FAIL (the code is
wrong), named as such. It adds a check and never removes one: the bf16 verdict is still reached on the bf16 run's own
evidence, and where the float32 build cannot run (a served engine runs in the server's dtype; an engine with no
float32 mode) that is said as "not checked" beside a verdict that never rested on it. `--no-float32-build` turns it
off (half the time).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from engines.errors import ModelError
from evalsuite.errors import SpecError
from evalsuite.plugins import engine_class
from evalsuite.results import DiffResult

WHAT = "the engine's float32 build (the same prompts, float32 bounds)"
# The float32 build runs diff's main part (fixed batches) only: it is there for kernel code whose error bf16 hides,
# and the batching paths (refill, shrink, split prefill, shared prefix) were driven and judged by the bf16 run.
MAIN_ONLY = ("the float32 build runs the fixed batches only: the bf16 run's batching part drove and judged the "
             "engine's batching paths")


def _said(result: DiffResult, why: str) -> DiffResult:
    return replace(result, checks_not_possible=(*result.checks_not_possible, f"{WHAT}: {why}"),
                   details={**result.details, "float32_build": {"run": False, "why": why}})


def with_float32_build(spec, result: DiffResult, diff_one: Callable) -> DiffResult:
    """result: the bf16 diff of spec. diff_one(spec) runs one diff. Returns result with the float32 build's
    verdict folded in (FAIL if it FAILs) and its summary under details["float32_build"]."""
    if not spec.float32_build:
        return _said(result, "turned off (--no-float32-build)")
    why_not = engine_class(spec.engine).no_float32_build
    if why_not:
        return _said(result, why_not)
    try:
        r32 = diff_one(replace(spec, dtype="float32", noise_tol=None, require=(), float32_build=False,
                                main_only=True))
    except (SpecError, ModelError) as e:  # the same spec ran in bf16: what fails here is the float32 build
        return _said(result, f"it could not be built: {e}")
    except Exception as e:  # a plugin's float32 path raised: the finished bf16 run is not lost to it
        return _said(result, f"it raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": "))
    summary = {"run": True, "verdict": r32.verdict, "real_mismatches": r32.real_mismatches,
               "prompts": r32.prompts, "positions": r32.positions, "prompts_identical": r32.prompts_identical,
               "failing_prompts": list(r32.failing_prompts), "not_checked": list(r32.not_checked),
               "deterministic": r32.deterministic, "scope": MAIN_ONLY, "seconds": r32.seconds}
    possible = result.checks_not_possible
    if r32.verdict == "INCONCLUSIVE":  # said; the bf16 verdict did not rest on it
        possible = (*possible, f"{WHAT}: INCONCLUSIVE ({'; '.join(r32.not_checked)})")
    return replace(result, verdict="FAIL" if r32.verdict == "FAIL" else result.verdict,
                   checks_not_possible=possible, seconds=round(result.seconds + r32.seconds, 1),  # both runs
                   details={**result.details, "float32_build": summary})
