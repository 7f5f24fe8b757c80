"""What the batching part costs: the wall time of a default `evalsuite diff` with and without it, run one after
the other on the same machine, each in a fresh process (nothing shared but jax's persistent compilation cache,
warmed by a first untimed run of each). A benchmark: prints figures, asserts nothing.

    .venv/bin/python -m benchmarks.diff_cost --out benchmarks/results/diff-cost.json
    .venv/bin/python -m benchmarks.diff_cost --model mini-llama --prompts quick --max-new-tokens 8 --out /tmp/x.json
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from evalsuite.versions import commit, versions


def _diff(args: list[str]) -> tuple[float, dict, float]:
    """One `evalsuite diff` process: (wall seconds, its JSON, peak RSS of the children so far in GB)."""
    t0 = time.time()
    p = subprocess.run([sys.executable, "-m", "evalsuite.cli", "diff", *args, "--json"], capture_output=True, text=True)
    wall = time.time() - t0
    if p.returncode not in (0, 1, 3):
        raise SystemExit(f"error: diff exited {p.returncode}: {p.stderr.strip().splitlines()[-1:]}")
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
    return wall, json.loads(p.stdout), rss


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="a default diff's time with and without the batching part")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--prompts", default="builtin")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--repeats", type=int, default=1, help="timed runs of each, alternating")
    ap.add_argument("--warm", choices=("each", "superset", "none"), default="each",
                    help="each: an untimed run of each mode first; superset: one untimed run with the batching part "
                         "(its programs include every one the run without it compiles); none: jax's cache is warm "
                         "already (an earlier run of the same settings on this machine)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    base = ["--model", a.model, "--prompts", a.prompts, "--max-new-tokens", str(a.max_new_tokens), "--dtype", a.dtype]
    modes = {"with batching part (default)": [], "without (--no-batching)": ["--no-batching"]}
    warm = modes if a.warm == "each" else dict(list(modes.items())[:1]) if a.warm == "superset" else {}
    for name, extra in warm.items():  # warm jax's compilation cache, so neither timed run pays for compiling
        print(f"warming: {name}", file=sys.stderr, flush=True)
        _diff(base + extra)
    runs: dict[str, list[dict]] = {name: [] for name in modes}
    for _ in range(a.repeats):
        for name, extra in modes.items():
            wall, r, rss = _diff(base + extra)
            b = r.get("batching") or {}
            runs[name].append({"wall_s": round(wall, 1), "verdict": r["verdict"], "diff_seconds": r["seconds"],
                               "batching_seconds": b.get("seconds"), "batching_prompt_runs": b.get("prompts"),
                               "paths_not_exercised": (r.get("paths") or {}).get("not_exercised")})
            print(f"{name}: {wall:.1f} s, {r['verdict']}", file=sys.stderr, flush=True)
    best = {name: min(x["wall_s"] for x in rs) for name, rs in runs.items()}
    with_, without = best["with batching part (default)"], best["without (--no-batching)"]
    doc = {"benchmark": "diff_cost", "settings": vars(a) | {"out": None}, "runs": runs, "best_wall_s": best,
           "ratio": round(with_ / without, 3), "added_s": round(with_ - without, 1),
           "commit": commit(Path(__file__).resolve().parent), "versions": versions()}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"default diff on {a.model} ({a.prompts}, {a.max_new_tokens} tokens, {a.dtype}): {with_:.0f} s with the "
          f"batching part, {without:.0f} s without: {doc['ratio']:.2f}x (+{doc['added_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
