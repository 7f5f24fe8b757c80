"""A full-size `evalsuite run` kept as exported shards, so that it can be computed over several machines or days.

    .venv/bin/python -m benchmarks.full_run --task gsm8k --shards 8 --data ../shared/data \\
        --results benchmarks/results/gsm8k-full

For each shard i of N not yet in --results: `evalsuite run TASK --shard i/N --output WORK/si` (resumable from
its journal after a kill), then `evalsuite export` of it into RESULTS/si (no prompts, no gold answers: fit to
commit) with its wall time, peak RSS and the commit it ran at (RESULTS/si/run.json). `--only 2,3` runs just
those shards (one host's share). When every shard is in RESULTS, `evalsuite merge` writes RESULTS/merged and
the run's verdict is printed. `merge` refuses shards from different engine builds, so shards computed later
must come from a checkout whose engines are the same (their fingerprints say so). A benchmark: it prints
figures and writes files; it asserts nothing. Exit: merge's verdict code when merged, else 0.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from evalsuite.versions import commit

ROOT = Path(__file__).resolve().parent.parent


def _cli(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evalsuite.cli", *args], cwd=ROOT, text=True, **kw)


def run_measured(*args: str) -> tuple[int, str, float, float]:
    """Run the CLI; return its exit code, stdout, this child's own peak RSS in GB (from wait4, as
    /usr/bin/time -v reports it, so shards run either way record the same figure) and its CPU seconds (user +
    system: against the wall time, it shows a shard that was paused or shared the cores)."""
    p = subprocess.Popen([sys.executable, "-m", "evalsuite.cli", *args], cwd=ROOT, text=True,
                         stdout=subprocess.PIPE)
    out = p.stdout.read()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, out, round(usage.ru_maxrss / 2**20, 2), round(usage.ru_utime + usage.ru_stime, 1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="a full-size run, kept as exported shards")
    ap.add_argument("--task", default="gsm8k")
    ap.add_argument("--variant", default=None)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--data", default="../shared/data")
    ap.add_argument("--limit", type=int, default=None, help="the first N items only (a trial of the pipeline)")
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--only", default=None, help="comma-separated shard indices (default: every missing one)")
    ap.add_argument("--work", default=None, help="run folders (default runs/full-TASK)")
    ap.add_argument("--results", required=True, help="exported shards and the merged result")
    a = ap.parse_args(argv)
    n = a.shards
    todo = range(n) if a.only is None else [int(x) for x in a.only.split(",")]
    if n < 1 or any(not 0 <= i < n for i in todo):
        print(f"error: shards must be 0..{n - 1} of --shards {n}", file=sys.stderr)
        return 2
    work, results = Path(a.work or f"runs/full-{a.task}"), Path(a.results)
    at = commit(ROOT)
    extra = (["--variant", a.variant] if a.variant else []) + (["--limit", str(a.limit)] if a.limit else [])
    for i in todo:
        if (results / f"s{i}" / "comparison.json").is_file():
            print(f"shard {i}/{n}: already in {results}", flush=True)
            continue
        t0 = time.time()
        rc, out, peak_gb, cpu_s = run_measured("run", a.task, *extra, "--model", a.model, "--data", a.data,
                                                 "--shard", f"{i}/{n}", "--output", str(work / f"s{i}"), "--json")
        if rc not in (0, 1, 3):
            print(f"shard {i}/{n}: run failed (exit {rc}); rerun to resume it", file=sys.stderr)
            return rc
        e = _cli("export", str(work / f"s{i}"), "--output", str(results / f"s{i}"), capture_output=True)
        if e.returncode:
            print(e.stderr.strip(), file=sys.stderr)
            return e.returncode
        r = json.loads(out)
        meta = {"shard": f"{i}/{n}", "commit": at, "wall_s": round(time.time() - t0, 1),
                "peak_rss_gb": peak_gb, "cpu_s_of_run": cpu_s,
                "verdict_of_this_share": r["verdict"], "items": r["items"],
                "accuracy": {k: v["accuracy"] for k, v in r["engines"].items()}}
        (results / f"s{i}" / "run.json").write_text(json.dumps(meta, indent=1) + "\n")
        print(json.dumps(meta), flush=True)
    have = [i for i in range(n) if (results / f"s{i}" / "comparison.json").is_file()]
    if len(have) < n:
        print(f"{len(have)} of {n} shards in {results}; missing: {sorted(set(range(n)) - set(have))}")
        return 0
    m = _cli("merge", *[str(results / f"s{i}") for i in range(n)], "--output", str(results / "merged"))
    return m.returncode


if __name__ == "__main__":
    sys.exit(main())
