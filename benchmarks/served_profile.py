"""Where a served `diff` spends its time: `evalsuite serve` on loopback (the megakernel), then `run_diff`
with `--engine openai` against it, every engine call timed (generate, forced_topk, score; the client's
and the in-process reference's). A benchmark: prints figures, asserts nothing.

    .venv/bin/python -m benchmarks.served_profile [--n 24] [--model smollm2-135m] [--dtype float32]

The prompts are benchmarks/make_prompts.py's seeded set of --n prompts (seed 0).
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

from benchmarks.false_alarms import Server
from benchmarks.make_prompts import main as make_prompts


def timed(cls, name: str, log: list) -> None:
    f = cls.__dict__[name]

    @functools.wraps(f)
    def wrapper(self, *args, **kwargs):
        t = time.perf_counter()
        out = f(self, *args, **kwargs)
        log.append((f"{cls.__name__}.{name}", len(args[0]), time.perf_counter() - t))
        print(f"  {log[-1][0]:28s} rows {log[-1][1]:3d}  {log[-1][2]:6.1f} s", flush=True)
        return out

    setattr(cls, name, wrapper)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="time the engine calls of a served diff")
    ap.add_argument("--n", type=int, default=24)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--prompts", default="runs/served-profile-prompts.jsonl")
    a = ap.parse_args(argv)
    if a.n < 1:
        print("error: --n must be >= 1", file=sys.stderr)
        return 2
    Path(a.prompts).parent.mkdir(parents=True, exist_ok=True)
    make_prompts(["--n", str(a.n), "--seed", "0", "--out", a.prompts])

    import engines.openai.client as client
    from engines.megakernel import MegakernelEngine
    from engines.reference import ReferenceEngine
    from evalsuite.compare.diff import DiffSpec, run_diff

    log: list = []
    for cls in (client.OpenAIEngine, ReferenceEngine, MegakernelEngine):
        for name in ("generate", "forced_topk", "score"):
            if name in cls.__dict__:
                timed(cls, name, log)
    server = Server(a.model, a.dtype)
    t0 = time.perf_counter()
    url = server.start()
    print(f"server up in {time.perf_counter() - t0:.1f} s", flush=True)
    try:
        t = time.perf_counter()
        r = run_diff(DiffSpec(model=a.model, dtype=a.dtype, prompts=a.prompts, max_new_tokens=a.max_new_tokens,
                              engine="openai", engine_options=(("base_url", url),))).to_json()
        wall = time.perf_counter() - t
    finally:
        server.stop()
    by: dict[str, float] = {}
    for name, _, s in log:
        by[name] = by.get(name, 0.0) + s
    print(f"diff: {r['verdict']}, {a.n} prompts, {wall:.1f} s")
    for name, s in sorted(by.items(), key=lambda x: -x[1]):
        print(f"  {name:28s} {s:7.1f} s in all ({100 * s / wall:.0f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
