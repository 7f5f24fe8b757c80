"""The judge scoring the engine's answers against the judge decoding its own, on the same items: both modes of
`evalsuite run`, side by side. Prints figures and writes a JSON; asserts nothing.

    .venv/bin/python -m benchmarks.judge_scoring --task gsm8k --limit 100 --data ../shared/data \\
        --json benchmarks/results/judge-scoring-gsm8k.json

1. `evalsuite run TASK` (scoring mode, the default) in WORK/scores, from nothing.
2. `evalsuite run TASK --judge-decodes` in WORK/decodes, with the engine's journal of step 1 copied in: the engine's
   answers are the same (its journal is keyed by its fingerprint), so only the judge's phase is computed again, and
   that mode's whole-run wall time is step 1's engine phase plus its own judge and parity phases.
Then: the judge's answers, accuracies, paired verdicts and parity compared between the modes; the judge's decoded
tokens against the engine's generated tokens; each phase's wall time and each process's peak RSS.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from benchmarks.full_run import run_measured
from evalsuite.versions import commit, versions


def _records(d: Path, engine: str) -> list[dict]:
    return [json.loads(x) for x in (d / engine / "records.jsonl").read_text().splitlines()]


def _mode(r: dict, rss: float, cpu: float) -> dict:
    pa, work, ph = r["parity"], r["judge_work"], r["phases"]
    return {"verdict": r["verdict"], "failed_by": r["failed_by"],
            "accuracy": {k: v["accuracy"] for k, v in r["engines"].items()},
            "paired": {k: r["paired"][k] for k in ("b", "c", "loss_upper", "items_needed")},
            "parity": {k: pa.get(k) for k in ("run", "judged", "items", "items_identical", "items_failing",
                                              "real_mismatches", "benign_divergences", "positions")},
            "judge_work": work, "phases_s": ph, "peak_rss_gb": rss, "cpu_s": cpu}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="the judge scoring vs decoding, both modes on the same items")
    ap.add_argument("--task", default="gsm8k")
    ap.add_argument("--variant", default=None)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--limit", type=int, default=100)
    ap.add_argument("--data", default="../shared/data")
    ap.add_argument("--work", default=None, help="run folders (default runs/judge-scoring-TASK)")
    ap.add_argument("--json", required=True)
    a = ap.parse_args(argv)
    work = Path(a.work or f"runs/judge-scoring-{a.task}{'-' + a.variant if a.variant else ''}")
    base = ["run", a.task, "--model", a.model, "--limit", str(a.limit), "--data", a.data, "--json"]
    base += ["--variant", a.variant] if a.variant else []
    out: dict = {"benchmark": "judge_scoring", "task": a.task, "variant": a.variant, "model": a.model,
                 "limit": a.limit, "data": a.data, "commit": commit(Path(__file__).resolve().parent),
                 "versions": versions()}
    runs = {}
    for mode in ("scores", "decodes"):
        d = work / mode
        if d.exists():
            shutil.rmtree(d)
        extra = []
        if mode == "decodes":
            extra = ["--judge-decodes"]
            src = work / "scores" / "megakernel" / "journal.jsonl"
            (d / "megakernel").mkdir(parents=True)
            shutil.copy(src, d / "megakernel" / "journal.jsonl")
        t = time.time()
        rc, stdout, rss, cpu = run_measured(*base, "--output", str(d), *extra)
        if rc not in (0, 1, 3):
            print(f"{mode}: evalsuite run exited {rc}", file=sys.stderr)
            return rc
        r = json.loads(stdout)
        runs[mode] = r
        out[mode] = _mode(r, rss, cpu) | {"process_wall_s": round(time.time() - t, 1)}
        print(f"{mode}: {r['verdict']} in {out[mode]['process_wall_s']} s, phases {r['phases']}, peak {rss} GB",
              flush=True)
    s, dd = runs["scores"], runs["decodes"]
    js, jd = _records(work / "scores", "reference"), _records(work / "decodes", "reference")
    same = [x["response"] == y["response"] and x["correct"] == y["correct"] for x, y in zip(js, jd)]
    eng = s["phases"]["engine_s"]
    out["comparison"] = {
        "items": len(js), "judge_answers_identical": sum(same),
        "differing_items": [x["doc_id"] for x, ok in zip(js, same) if not ok],
        "verdicts": [s["verdict"], dd["verdict"]], "paired_identical": s["paired"] == dd["paired"],
        "accuracies_identical": all(s["engines"][k]["accuracy"] == dd["engines"][k]["accuracy"] for k in s["engines"]),
        "engine_generated_tokens": s["judge_work"]["engine_generated"],
        "judge_decoded_tokens": s["judge_work"]["judge_decoded"],
        "decoded_share": s["judge_work"]["decoded_share"],
        "whole_run_s": {"scores": round(eng + s["phases"]["judge_s"] + s["phases"]["parity_s"], 1),
                        "decodes": round(eng + dd["phases"]["judge_s"] + dd["phases"]["parity_s"], 1)},
        "judge_phase_s": {"scores": s["phases"]["judge_s"], "decodes": dd["phases"]["judge_s"]},
        "note": "whole run = the engine's phase (computed once, in the scoring run; the decoding run reads its "
                "journal) + each mode's judge and parity phases; setup (loading, building) left out of both"}
    c = out["comparison"]
    c["judge_speedup"] = round(c["judge_phase_s"]["decodes"] / max(c["judge_phase_s"]["scores"], 1e-9), 2)
    c["whole_run_speedup"] = round(c["whole_run_s"]["decodes"] / max(c["whole_run_s"]["scores"], 1e-9), 2)
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    print(f"judge answers identical on {c['judge_answers_identical']}/{c['items']} items; verdicts {c['verdicts']}; "
          f"judge decoded {c['judge_decoded_tokens']} of the engine's {c['engine_generated_tokens']} tokens "
          f"({(c['decoded_share'] or 0):.1%}); whole run {c['whole_run_s']['scores']} s vs "
          f"{c['whole_run_s']['decodes']} s ({c['whole_run_speedup']}x); judge {c['judge_phase_s']['scores']} s vs "
          f"{c['judge_phase_s']['decodes']} s ({c['judge_speedup']}x)")
    print(a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
