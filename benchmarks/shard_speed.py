"""Item sharding over processes: one `evalsuite run` against two `--shard i/2` workers on the same machine
(prints figures, asserts nothing but that the merge equals the single run).

    .venv/bin/python -m benchmarks.shard_speed [--task gsm8k] [--limit 24] [--model smollm2-135m] [--json]

In the same run, with the same compilation cache (warmed first by a 2-item run, so neither side pays
compilation the other does not): the wall time and items/min of one process over every item, of two
worker processes launched together (each `--shard i/2 --output DIR_i`), and the ratio. Then
`evalsuite merge` of the two shard folders must give the single run's per-item records and verdict. Without
--pin the workers share this machine's cores, so the ratio says how much of the machine one run leaves idle;
with --pin every process gets one core of its own (the single run core 0, shard i core i), as N one-core
hosts would.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EVALSUITE = str(Path(sys.executable).with_name("evalsuite"))


def _run(args: list[str], env: dict, cpu: int | None = None) -> subprocess.Popen:
    """`evalsuite run ARGS`; cpu: pinned to that one core (taskset), as one host of a one-core cluster."""
    pin = ["taskset", "-c", str(cpu)] if cpu is not None else []
    return subprocess.Popen([*pin, EVALSUITE, "run", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _wait(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        out, err = p.communicate()
        if p.returncode not in (0, 1, 3):
            raise SystemExit(f"evalsuite run failed (exit {p.returncode}): {err.strip().splitlines()[-1:]}")


def _records(folder: Path, engines: tuple[str, str]) -> tuple:
    """Both engines' per-item records and the comparison's verdict, items and paired counts."""
    doc = json.loads((folder / "comparison.json").read_text())
    recs = [[json.loads(x) for x in (folder / e / "records.jsonl").read_text().splitlines()] for e in engines]
    return recs, doc["verdict"], doc["items"], doc["paired"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="gsm8k")
    ap.add_argument("--limit", type=int, default=24)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--engine", default="megakernel")
    ap.add_argument("--pin", action="store_true",
                    help="each process on its own core (the single run on core 0, shard i on core i): N one-core hosts")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="evalsuite-shard-speed-"))
    env = {**os.environ, "EVALSUITE_COMPILE_CACHE": str(root / "jaxcache")}
    common = [a.task, "--model", a.model, "--engine", a.engine, "--against", "reference"]

    _wait([_run([*common, "--limit", "2", "--output", str(root / "warm")], env)])
    t = time.perf_counter()
    _wait([_run([*common, "--limit", str(a.limit), "--output", str(root / "one")], env, 0 if a.pin else None)])
    one = time.perf_counter() - t
    t = time.perf_counter()
    _wait([_run([*common, "--limit", str(a.limit), "--shard", f"{i}/2", "--output", str(root / f"s{i}")], env,
                i if a.pin else None) for i in range(2)])
    two = time.perf_counter() - t
    merged = subprocess.run([EVALSUITE, "merge", str(root / "s0"), str(root / "s1"), "--output", str(root / "merged")],
                            capture_output=True, text=True)
    if merged.returncode not in (0, 1, 3):
        raise SystemExit(f"evalsuite merge failed: {merged.stderr.strip()}")
    engines = (a.engine, "reference")
    same = _records(root / "merged", engines) == _records(root / "one", engines)
    fig = {"task": a.task, "model": a.model, "engine": a.engine, "items": a.limit, "cpus": os.cpu_count(),
           "pinned": a.pin,
           "one_process_s": round(one, 1), "two_processes_s": round(two, 1),
           "one_items_per_min": round(a.limit / one * 60, 1), "two_items_per_min": round(a.limit / two * 60, 1),
           "ratio": round(one / two, 2), "merge_equals_single_run": same, "folder": str(root)}
    if a.json:
        print(json.dumps(fig))
    else:
        where = "one core per process" if a.pin else f"{fig['cpus']} CPUs shared"
        print(f"{a.task} on {a.model}, {a.engine} vs reference, {a.limit} items, {where}:")
        print(f"  1 process : {one:7.1f} s  {fig['one_items_per_min']:6.1f} items/min")
        print(f"  2 shards  : {two:7.1f} s  {fig['two_items_per_min']:6.1f} items/min  ({fig['ratio']:.2f}x)")
        print(f"  merge of the 2 shards equals the single run (records and verdict): {same}")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
