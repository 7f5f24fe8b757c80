"""`evalsuite verify`: the whole gate on the defaults, one verdict, one report folder.

golden check (the engine against the committed goldens), diff (token parity vs the reference),
sanity, gsm8k and gpqa (paired accuracy verdicts). Overall (evalsuite.verdict.combine): FAIL if
any part fails; INCONCLUSIVE if none fails but a part could not show its claim (too few items for
the margin, a check not possible, or a part that could not run at all: it is kept as "not checked:
why", never dropped); else PASS. Parts left out with --parts are listed as not run. verify.json
and report.md are always written, whatever the parts did. Every part's warnings reach both.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from engines.errors import ModelError, UnsupportedModel
from evalsuite.errors import SpecError
from evalsuite.report import diff_report, verify_markdown, write_json
from evalsuite.results import VerifyResult
from evalsuite.verdict import combine
from evalsuite.versions import versions

TASKS = ("sanity", "gsm8k", "gpqa")
PARTS = ("golden", "diff", *TASKS)


def _names(text: str, known: tuple[str, ...], option: str) -> tuple[str, ...]:
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    bad = [t for t in names if t not in known]
    if bad or not names:
        raise SpecError(f"{option} {text!r}: unknown {bad or 'empty'}; expected some of {', '.join(known)}")
    return names


def parse_tasks(text: str) -> tuple[str, ...]:
    """--tasks "sanity,gsm8k": the benchmarks named, each known."""
    from evalsuite.bench.run import VARIANTS

    return _names(text, tuple(VARIANTS), "--tasks")


def parse_parts(text: str) -> tuple[str, ...]:
    """--parts "diff,gsm8k": the parts named, each known."""
    return _names(text, PARTS, "--parts")


def _not_checked(why: str) -> dict:
    """A part that could not run: kept, with why, and INCONCLUSIVE (it shows nothing, so the whole cannot PASS)."""
    return {"verdict": "INCONCLUSIVE", "ran": False, "not_checked": why, "problems": [],
            "warnings": [f"not checked: {why}"]}


def run_verify(model: str, engine: str, dtype: str, fault: str | None, out: Path,
               progress: Callable[[str], None], tasks: tuple[str, ...] = TASKS,
               data_dir: str | None = None, limit: int | None = None, prompts: str = "builtin",
               require: tuple[str, ...] = (), engine_options: tuple[tuple[str, str], ...] = (),
               parts_asked: tuple[str, ...] = PARTS, gpqa_variant: str | None = None) -> VerifyResult:
    from evalsuite import golden
    from evalsuite.bench.run import RunSpec, run_benchmark
    from evalsuite.compare.diff import DiffSpec, run_diff

    t0 = time.time()
    spec = DiffSpec(engine=engine, model=model, dtype=dtype, fault=fault, prompts=prompts,
                    require=require, engine_options=engine_options)  # a bad --require: one line, before any work
    run_tasks = tuple(t for t in tasks if t in parts_asked)
    specs = {task: RunSpec(task=task, engine=engine, model=model, dtype=dtype, fault=fault, limit=limit,
                           data_dir=data_dir if task != "sanity" else None, output=str(out / task),
                           engine_options=engine_options, variant=gpqa_variant if task == "gpqa" else None,
                           variant_option="--gpqa-variant")
             for task in run_tasks}  # a bad variant: one line, before any work
    out.mkdir(parents=True, exist_ok=True)
    if data_dir == "hub":  # every hub download first, before anything reads local files offline
        from evalsuite.bench.data import HUB, from_hub

        for task in run_tasks:
            if task in HUB:
                progress(f"verify: {task} from the hub")
                from_hub(task)
    parts: dict[str, dict] = {}

    def part(name: str, fn) -> None:
        """One part; one that cannot run is kept as not checked (why), and the next part still runs."""
        try:
            parts[name] = {"ran": True, **fn()}
        except (ModelError, SpecError, UnsupportedModel) as e:
            why = " ".join(str(e).split())
            progress(f"verify: {name} not checked: {why}")
            parts[name] = _not_checked(why)

    def golden_part() -> dict:
        g = golden.check(model, engine, dtype, fault, extra=dict(engine_options))
        return {"verdict": g.verdict, "problems": list(g.problems), "summary": g.summary,
                "warnings": list(g.not_checked)}

    def diff_part() -> dict:
        d = run_diff(spec, progress).to_json()
        diff_report(d, out / "diff")
        p = {k: d[k] for k in ("verdict", "real_mismatches", "benign_divergences", "prompts",
                               "prompts_identical", "noise_tolerance", "batch_invariance_required")}
        p["float32_build"] = d.get("float32_build")  # bf16: the engine built in float32 (compare/build.py)
        p["warnings"] = [f"not checked (no PASS without it): {n}" for n in d["not_checked"]] + [
            f"not checked: {n}" for n in d["checks_not_possible"]]  # what blocks a PASS first: the report's "why"
        return p

    def task_part(task: str) -> dict:
        r = run_benchmark(specs[task], progress).to_json()
        return {"verdict": r["verdict"], "items": r["items"], "variant": r["variant"],
                "bundled_sample": r["dataset"]["bundled_sample"], "dataset": r["dataset"]["path"],
                "accuracy": {k: v["accuracy"] for k, v in r["engines"].items()}, "paired": r["paired"],
                "settle": r["settle"], "warnings": r["warnings"], "failed_by": r["failed_by"],
                "parity": {k: r["parity"].get(k) for k in ("run", "judged", "items", "items_identical",
                                                           "items_failing", "first_failures")},
                "judge_work": r["judge_work"]}

    if "golden" in parts_asked and model not in golden.DEFAULTS:
        parts["golden"] = {"verdict": "SKIPPED", "problems": [f"no golden settings for {model}"]}
    elif "golden" in parts_asked:
        progress(f"verify: golden check ({engine})")
        part("golden", golden_part)
    if "diff" in parts_asked:
        progress("verify: diff")
        part("diff", diff_part)
    for task in run_tasks:
        part(task, lambda task=task: task_part(task))
    return _write(out, VerifyResult(
        verdict=combine(p["verdict"] for p in parts.values()), model=model, engine=engine, dtype=dtype, fault=fault,
        parts=parts, warnings=tuple(f"{name}: {w}" for name, p in parts.items() for w in p.get("warnings", [])),
        details={"parts_not_run": [name for name in PARTS if name not in parts],
                 "base_url": dict(engine_options).get("base_url"),
                 "data": {None: "bundled samples", "bundled": "bundled samples",
                          "hub": "the hub (datasets)"}.get(data_dir, data_dir),
                 "versions": versions(), "seconds": round(time.time() - t0, 1)}))


def _write(out: Path, result: VerifyResult) -> VerifyResult:
    """verify.json and report.md, whatever the parts did."""
    write_json(out / "verify.json", result.to_json())
    (out / "report.md").write_text(verify_markdown(result.to_json()))
    return result
