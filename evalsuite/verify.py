"""`evalsuite verify`: the whole gate on the defaults, one verdict, one report folder.

golden check (the engine against the committed goldens), diff (token parity vs the reference),
gsm8k and gpqa (paired accuracy verdicts). Overall: FAIL if any part fails; INCONCLUSIVE if none
fails but a benchmark cannot yet show non-inferiority (too few items for the margin); else PASS.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from evalsuite.report import diff_report, write_json
from evalsuite.versions import versions


def run_verify(model: str, engine: str, dtype: str, fault: str | None, out: Path,
               progress: Callable[[str], None], remote=None) -> dict:
    from evalsuite import golden
    from evalsuite.bench.run import RunSpec, run_benchmark
    from evalsuite.compare.diff import DiffSpec, run_diff

    t0 = time.time()
    out.mkdir(parents=True, exist_ok=True)
    parts: dict[str, dict] = {}
    if model in golden.DEFAULTS:
        progress(f"verify: golden check ({engine})")
        g = golden.check(model, engine, dtype, fault, remote=remote)
        parts["golden"] = {"verdict": "PASS" if g.ok else "FAIL", "problems": g.problems, "summary": g.summary}
    else:
        parts["golden"] = {"verdict": "SKIPPED", "problems": [f"no golden settings for {model}"]}
    progress("verify: diff")
    d = run_diff(DiffSpec(engine=engine, model=model, dtype=dtype, fault=fault, remote=remote), progress)
    diff_report(d, out / "diff")
    parts["diff"] = {k: d[k] for k in ("verdict", "real_mismatches", "benign_divergences", "prompts",
                                       "prompts_identical", "noise_tolerance")}
    for task in ("gsm8k", "gpqa"):
        r = run_benchmark(RunSpec(task=task, engine=engine, model=model, dtype=dtype, fault=fault,
                                  output=str(out / task), remote=remote), progress)
        parts[task] = {"verdict": r["verdict"], "items": r["items"], "bundled_sample": r["dataset"]["bundled_sample"],
                       "accuracy": {k: v["accuracy"] for k, v in r["engines"].items()}, "paired": r["paired"]}
    verdicts = [p["verdict"] for p in parts.values() if p["verdict"] != "SKIPPED"]
    overall = "FAIL" if "FAIL" in verdicts else "INCONCLUSIVE" if "INCONCLUSIVE" in verdicts else "PASS"
    result = {"verdict": overall, "model": model, "engine": engine, "dtype": dtype, "fault": fault,
              "base_url": remote.base_url if remote is not None else None, "parts": parts,
              "versions": versions(), "seconds": round(time.time() - t0, 1)}
    write_json(out / "verify.json", result)
    lines = [f"# evalsuite verify: {engine} ({dtype}, fault={fault or 'none'}) on {model} — **{overall}**", "",
             "| part | verdict | figures |", "|---|---|---|"]
    g = parts["golden"]
    lines.append(f"| golden | {g['verdict']} | " + (f"{g['summary'].get('positions', 0)} positions, max abs Δlogprob "
                                                     f"{g['summary'].get('max_dlogprob', 0):.2e}" if g.get("summary")
                                                     else "; ".join(g["problems"])) + " |")
    lines.append(f"| diff | {d['verdict']} | {d['real_mismatches']} real, {d['benign_divergences']} benign, "
                 f"{d['prompts_identical']}/{d['prompts']} prompts identical (diff/report.md) |")
    for task in ("gsm8k", "gpqa"):
        p = parts[task]
        acc = ", ".join(f"{k} {v:.3f}" for k, v in p["accuracy"].items())
        sample = " (bundled sample)" if p["bundled_sample"] else ""
        lines.append(f"| {task} | {p['verdict']} | {p['items']} items{sample}"
                     f": {acc}; b={p['paired']['b']} c={p['paired']['c']}, diff CI "
                     f"[{p['paired']['diff_ci'][0]:+.3f}, {p['paired']['diff_ci'][1]:+.3f}] |")
    if overall == "INCONCLUSIVE":
        lines += ["", "INCONCLUSIVE: no part failed, but a benchmark has too few items to show the accuracy "
                      "loss is within the margin (with nothing discordant, n items bound a loss only to 3/n)."]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    return result
