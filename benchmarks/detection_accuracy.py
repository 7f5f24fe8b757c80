"""Does `evalsuite run` catch each fault? A fault is caught when the run FAILs; each row says through which part:
the paired accuracy verdict (an lm-eval-style comparison, the detection table's accuracy-only column) or the parity
part (every answer position against the judge's greedy track).

    .venv/bin/python -m benchmarks.detection_accuracy --task gpqa --limit 100 --data ../shared/data \\
        --out benchmarks/results/detection-accuracy-gpqa.json

Each fault runs `evalsuite run TASK --fault F` into one output folder per model, so the reference's
answers are computed once and reused from its journal (its key holds no fault); the megakernel's are
computed per fault. `--resume` keeps the rows already in --out (same task, limit and data) and runs only the
faults missing there; each row names the commit it was measured at. A benchmark: it prints figures and writes
JSON; it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from engines.megakernel.faults import CATALOGUE, MODEL_NEEDS
from evalsuite.versions import commit, versions


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="accuracy-only detection of each fault")
    ap.add_argument("--task", default="gpqa", choices=("gpqa", "gsm8k"))
    ap.add_argument("--limit", type=int, default=100)
    ap.add_argument("--data", default="../shared/data")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--moe-model", default="mini-moe")
    ap.add_argument("--faults", default="all")
    ap.add_argument("--runs", default="runs/detection-accuracy")
    ap.add_argument("--out", required=True)
    ap.add_argument("--resume", action="store_true", help="keep the rows already in --out, run the missing faults")
    a = ap.parse_args(argv)
    names = [f.name for f in CATALOGUE] if a.faults == "all" else a.faults.split(",")
    needs = {f.name: f.needs for f in CATALOGUE}
    bad = [n for n in names if n not in needs]
    if bad or a.limit < 1:
        print(f"error: unknown fault(s) {bad}" if bad else "error: --limit must be >= 1", file=sys.stderr)
        return 2
    at = commit(Path(__file__).resolve().parent)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows, first = _kept(out, a) if a.resume else ([], at)
    done = {r["fault"] for r in rows if "error" not in r}
    rows = [r for r in rows if r["fault"] in done]
    for f in [n for n in names if n not in done]:
        if needs[f] in MODEL_NEEDS and needs[f] != "moe":  # a family's own layers: not on this benchmark's models
            print(f"{f}: skipped, it needs {MODEL_NEEDS[needs[f]][0]} (benchmarks/detection.py runs it)",
                  file=sys.stderr)
            continue
        model = a.moe_model if needs[f] == "moe" else a.model
        t0 = time.time()
        p = subprocess.run([sys.executable, "-m", "evalsuite.cli", "run", a.task, "--model", model, "--data", a.data,
                            "--limit", str(a.limit), "--fault", f, "--output", f"{a.runs}/{a.task}-{model}", "--json"],
                           capture_output=True, text=True)
        if p.returncode not in (0, 1, 3):
            rows.append({"fault": f, "model": model, "error": (p.stderr.strip().splitlines() or ["?"])[-1]})
        else:
            r = json.loads(p.stdout)
            pa = r.get("parity") or {}
            rows.append({"fault": f, "model": model, "verdict": r["verdict"], "caught": r["verdict"] == "FAIL",
                         "caught_by_accuracy": "accuracy" in r.get("failed_by", []),
                         "caught_by_parity": "parity" in r.get("failed_by", []),
                         "parity": {k: pa.get(k) for k in ("run", "judged", "items", "items_failing",
                                                           "real_mismatches")}
                         | {"first_failure": (pa.get("first_failures") or [None])[0]},
                         "judge_work": r.get("judge_work"),
                         "items": r["items"], "accuracy": {k: v["accuracy"] for k, v in r["engines"].items()},
                         "paired": {k: r["paired"].get(k) for k in ("b", "c", "loss_p", "loss_upper")},
                         "weights_sha256": r.get("weights_sha256"),
                         "data_sha256": (r.get("dataset") or {}).get("sha256"),
                         "seconds": round(time.time() - t0, 1), "commit": at})
        print(json.dumps(rows[-1]), flush=True)
        out.write_text(json.dumps({"task": a.task, "limit": a.limit, "data": a.data, "commit": first,
                                   "versions": versions(), "rows": rows}, indent=1))
    return 0


def _kept(out: Path, a) -> tuple[list[dict], str | None]:
    """The rows of an earlier run of the same table (rows without their own commit take the file's)."""
    if not out.exists():
        return [], None
    old = json.loads(out.read_text())
    if (old["task"], old["limit"]) != (a.task, a.limit):
        sys.exit(f"error: {out} holds {old['task']} --limit {old['limit']}, not {a.task} --limit {a.limit}")
    return [{**r, "commit": r.get("commit", old.get("commit"))} for r in old["rows"]], old.get("commit")


if __name__ == "__main__":
    sys.exit(main())
