"""`evalsuite verify`: the whole gate on the defaults, one verdict, one report folder.

golden check (the engine against the committed goldens), diff (token parity vs the reference),
sanity, gsm8k and gpqa (paired accuracy verdicts). Overall (evalsuite.verdict.combine): FAIL if
any part fails; INCONCLUSIVE if none fails but a part could not show its claim (too few items for
the margin, a check not possible); else PASS. Every part's warnings reach the JSON and the report.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from evalsuite.report import diff_report, verify_markdown, write_json
from evalsuite.results import VerifyResult
from evalsuite.verdict import combine
from evalsuite.versions import versions

TASKS = ("sanity", "gsm8k", "gpqa")


def parse_tasks(text: str) -> tuple[str, ...]:
    """--tasks "sanity,gsm8k": the benchmarks named, each known."""
    from evalsuite.bench.run import VARIANTS
    from evalsuite.errors import SpecError

    names = tuple(t.strip() for t in text.split(",") if t.strip())
    bad = [t for t in names if t not in VARIANTS]
    if bad or not names:
        raise SpecError(f"--tasks {text!r}: unknown {bad or 'empty'}; expected some of {', '.join(VARIANTS)}")
    return names


def run_verify(model: str, engine: str, dtype: str, fault: str | None, out: Path,
               progress: Callable[[str], None], tasks: tuple[str, ...] = TASKS,
               data_dir: str | None = None, limit: int | None = None, prompts: str = "builtin",
               require: tuple[str, ...] = (), engine_options: tuple[tuple[str, str], ...] = ()) -> VerifyResult:
    from evalsuite import golden
    from evalsuite.bench.run import RunSpec, run_benchmark
    from evalsuite.compare.diff import DiffSpec, run_diff

    t0 = time.time()
    spec = DiffSpec(engine=engine, model=model, dtype=dtype, fault=fault, prompts=prompts,
                    require=require, engine_options=engine_options)  # a bad --require: one line, before any work
    out.mkdir(parents=True, exist_ok=True)
    if data_dir == "hub":  # every hub download first, before anything reads local files offline
        from evalsuite.bench.data import HUB, from_hub

        for task in tasks:
            if task in HUB:
                progress(f"verify: {task} from the hub")
                from_hub(task)
    parts: dict[str, dict] = {}
    if model in golden.DEFAULTS:
        progress(f"verify: golden check ({engine})")
        g = golden.check(model, engine, dtype, fault, extra=dict(engine_options))
        parts["golden"] = {"verdict": g.verdict, "problems": list(g.problems), "summary": g.summary,
                           "warnings": list(g.not_checked)}
    else:
        parts["golden"] = {"verdict": "SKIPPED", "problems": [f"no golden settings for {model}"]}
    progress("verify: diff")
    d = run_diff(spec, progress).to_json()
    diff_report(d, out / "diff")
    parts["diff"] = {k: d[k] for k in ("verdict", "real_mismatches", "benign_divergences", "prompts",
                                       "prompts_identical", "noise_tolerance", "batch_invariance_required")}
    parts["diff"]["float32_build"] = d.get("float32_build")  # bf16: the engine built in float32 (compare/build.py)
    parts["diff"]["warnings"] = [f"not checked: {n}" for n in d["checks_not_possible"]]
    for task in tasks:
        r = run_benchmark(RunSpec(task=task, engine=engine, model=model, dtype=dtype, fault=fault, limit=limit,
                                  data_dir=data_dir if task != "sanity" else None,
                                  output=str(out / task), engine_options=engine_options),
                             progress).to_json()
        parts[task] = {"verdict": r["verdict"], "items": r["items"], "bundled_sample": r["dataset"]["bundled_sample"],
                       "dataset": r["dataset"]["path"],
                       "accuracy": {k: v["accuracy"] for k, v in r["engines"].items()}, "paired": r["paired"],
                       "settle": r["settle"], "warnings": r["warnings"], "failed_by": r["failed_by"],
                       "parity": {k: r["parity"].get(k) for k in ("run", "judged", "items", "items_identical",
                                                                  "items_failing", "first_failures")},
                       "judge_work": r["judge_work"]}
    overall = combine(p["verdict"] for p in parts.values())
    warnings = [f"{name}: {w}" for name, p in parts.items() for w in p.get("warnings", [])]
    result = VerifyResult(verdict=overall, model=model, engine=engine, dtype=dtype, fault=fault, parts=parts,
                          warnings=tuple(warnings), details={
                              "base_url": dict(engine_options).get("base_url"),
                              "data": {None: "bundled samples", "bundled": "bundled samples",
                                       "hub": "the hub (datasets)"}.get(data_dir, data_dir),
                              "versions": versions(),
                              "seconds": round(time.time() - t0, 1)})
    write_json(out / "verify.json", result.to_json())
    (out / "report.md").write_text(verify_markdown(result.to_json()))
    return result
