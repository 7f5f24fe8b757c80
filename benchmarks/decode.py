"""Decode benchmark on smollm2-135m float32: reference vs megakernel (prints figures, asserts nothing).

    .venv/bin/python -m benchmarks.decode [--steps N] [--json] [--results benchmarks/results/decode.json]

Figures, all measured in the same run: the machine's read bandwidth, the batch-1 floor (weight
bytes per step / bandwidth), the reference's decode ms/token at batch 1 (ratio to the floor) and
tokens/s at batch 8 and 32 (ratio to batch 1), batch 32 again at a GSM8K 5-shot context (1,000
tokens in a 2,048-slot cache), prefill tokens/s (one 256-token prompt; 4 x 1,024 tokens), the
megakernel's (generic interpret) ms/step at batch 1 and 8 with its ratio to the reference, TPU-
interpret seconds per step on the mini configs, the number of compilations inside the timed loops
(must be 0), and a fresh process's first generate with an empty and with a filled compilation cache
(--cold; engines.base.use_compile_cache).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax
import numpy as np

from engines.base import next_pow2
from evalsuite.speed_tables import decode_report

COLD_SCRIPT = """
import sys, time
t = time.perf_counter()
from evalsuite.models import load_model
from engines.reference import ReferenceEngine
ref = ReferenceEngine(load_model("smollm2-135m").weights, "float32")
t1 = time.perf_counter()
ref.generate([[1, 2, 3, 4, 5] * 20] * 3, 40)
print(time.perf_counter() - t1)
"""


def first_generate_seconds(cache_dir: str) -> float:
    """A fresh process's first generate (3 prompts of 100 tokens, 40 new: one prefill and two decode
    windows compiled), with the compilation cache in cache_dir."""
    import os
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", COLD_SCRIPT], capture_output=True, text=True, check=True,
                       env={**os.environ, "EVALSUITE_COMPILE_CACHE": cache_dir})
    return float(p.stdout.strip().splitlines()[-1])


def read_bandwidth_gbs(nbytes: int = 1 << 30, repeats: int = 5) -> float:
    """Best-of-N GB/s of summing a float32 array far larger than any cache (numpy)."""
    a = np.ones(nbytes // 4, np.float32)
    a.sum()
    best = min(_timed(a.sum) for _ in range(repeats))
    return nbytes / best / 1e9


def _timed(fn) -> float:
    t = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - t


def step_seconds(eng, batch: int, steps: int, slots: int = 256, context: int = 16) -> tuple[float, int]:
    """Median seconds of one decode step through the engine's step function after a context-token
    prompt, and compilations that happened inside the timed loop."""
    tokens = np.full((batch, next_pow2(context, 16)), 100, np.int32)
    lengths = np.full((batch,), context, np.int32)
    bundle = eng.steps()  # the stepped programs generate() drives
    *out, state = bundle.prefill(tokens, lengths, slots, 5, False)
    ids = np.asarray(out[0])
    *out, state = bundle.decode(ids, lengths, state, 5, False)  # compile
    jax.block_until_ready(out[0])
    before = eng.compiled_decode_shapes()
    times = []
    for i in range(steps):
        t = time.perf_counter()
        *out, state = bundle.decode(ids, lengths + 1 + i, state, 5, False)
        jax.block_until_ready(out[0])
        times.append(time.perf_counter() - t)
    return float(np.median(times)), eng.compiled_decode_shapes() - before


def floors(names: list[str], steps: int, as_json: bool) -> None:
    """Per model: the reference's float32 decode ms/token at batch 1 (32-token context, 128-slot cache) and the
    floor: the bytes a step must read (every weight, less an untied embedding table, of which a step reads one
    row) / this machine's read bandwidth (numpy, one thread), measured in the same run."""
    from engines.errors import ModelError
    from engines.reference import ReferenceEngine
    from evalsuite.models import load_model

    bw = read_bandwidth_gbs()
    rows = []
    for name in names:
        try:
            m = load_model(name)
        except ModelError as e:
            raise SystemExit(f"error: {e}") from None
        s, _ = step_seconds(ReferenceEngine(m.weights, "float32"), 1, steps, slots=128, context=32)
        read = m.weights.nbytes - (0 if m.config.tie_embeddings else m.weights.arrays["embed"].nbytes)
        floor = read / (bw * 1e9)
        rows.append({"model": name, "weight_bytes": m.weights.nbytes, "read_bytes": read, "floor_ms": floor * 1e3,
                     "ms_per_token": s * 1e3, "ratio_to_floor": s / floor})
    if as_json:
        print(json.dumps({"read_bandwidth_GBps": bw, "models": rows}, indent=1))
        return
    print(f"read bandwidth {bw:.1f} GB/s (numpy sum of 1 GiB, best of 5)")
    for r in rows:
        print(f"{r['model']:<20} {r['read_bytes'] / 1e6:8.1f} MB read/step  floor {r['floor_ms']:7.1f} ms/token  "
              f"reference {r['ms_per_token']:7.1f} ms/token ({r['ratio_to_floor']:.2f}x floor)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--results", default=None, help="also write the figures as JSON here (docs/benchmarks.md's table)")
    ap.add_argument("--cold", action="store_true",
                    help="also time a fresh process's first generate, cache empty/filled")
    ap.add_argument("--models", default=None,
                    help="comma-separated models: only the reference's batch-1 decode against the floor, per model "
                         "(e.g. gemma3-270m,qwen2.5-coder-0.5b after install.sh --models ...)")
    args = ap.parse_args()
    if args.results and not Path(args.results).parent.is_dir():  # before minutes of timing, not after
        raise SystemExit(f"error: --results {args.results}: no directory {Path(args.results).parent}")
    if args.models:
        return floors(args.models.split(","), args.steps, args.json)

    from engines.megakernel import MegakernelEngine
    from engines.reference import ReferenceEngine
    from evalsuite.models import load_model

    m = load_model("smollm2-135m")
    ref = ReferenceEngine(m.weights, "float32")
    mk = MegakernelEngine(m.weights, "float32")
    bw = read_bandwidth_gbs()
    floor_ms = m.weights.nbytes / (bw * 1e9) * 1e3
    r: dict = {"model": "smollm2-135m", "dtype": "float32", "read_bandwidth_GBps": bw,
               "weight_bytes": m.weights.nbytes, "floor_ms_per_token_b1": floor_ms, "recompiles": 0}
    ref_s = {}
    for b in (1, 8, 32):
        s, c = step_seconds(ref, b, args.steps)
        ref_s[b] = s
        r[f"ref_ms_per_step_b{b}"] = s * 1e3
        r[f"ref_tokens_per_s_b{b}"] = b / s
        r["recompiles"] += c
    r["ref_ratio_to_floor_b1"] = ref_s[1] * 1e3 / floor_ms
    s, c = step_seconds(ref, 32, max(5, args.steps // 3), slots=2048, context=1000)
    r["ref_ms_per_step_b32_ctx1000"] = s * 1e3
    r["ref_tokens_per_s_b32_ctx1000"] = 32 / s
    r["recompiles"] += c
    for b in (8, 32):
        r[f"ref_tokens_per_s_ratio_b{b}_vs_b1"] = (b / ref_s[b]) * ref_s[1]
    prompt = np.random.default_rng(0).integers(100, 40000, size=256).tolist()
    ref.generate([prompt], 1)  # compile the 256 bucket
    r["ref_prefill_tokens_per_s_256"] = 256 / min(_timed(lambda: ref.generate([prompt], 1)[0].top_ids)
                                                  for _ in range(3))
    long = np.random.default_rng(1).integers(100, 40000, size=(4, 1024)).tolist()
    ref.generate(long, 1)  # compile
    r["ref_prefill_tokens_per_s_4x1024"] = 4096 / min(_timed(lambda: ref.generate(long, 1)[0].top_ids)
                                                     for _ in range(2))
    for b in (1, 8):
        s, c = step_seconds(mk, b, max(5, args.steps // 3))
        r[f"mk_ms_per_step_b{b}"] = s * 1e3
        r[f"mk_ratio_vs_ref_b{b}"] = s / ref_s[b]
        r["recompiles"] += c
    for name in ("mini-llama", "mini-moe"):
        tpu = MegakernelEngine(load_model(name).weights, interpret="tpu")
        s, _ = step_seconds(tpu, 1, 3, slots=64)
        r[f"tpu_interpret_s_per_step_{name}"] = s
    if args.cold:
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            r["first_generate_s_cache_empty"] = first_generate_seconds(d)
            r["first_generate_s_cache_filled"] = first_generate_seconds(d)
        r["first_generate_s_cache_off"] = first_generate_seconds("off")
    if args.results:
        from evalsuite.versions import versions

        doc = {"benchmark": "decode", "command": f"python -m benchmarks.decode --steps {args.steps}"
               + (" --cold" if args.cold else ""), "steps": args.steps, "seed": 0, **r, "versions": versions(),
               "weights_sha256": m.weights.sha256}
        Path(args.results).write_text(json.dumps(doc, indent=1) + "\n")
    if args.json:
        print(json.dumps(r, indent=1))
        return
    for line in decode_report(r):
        print(line)




if __name__ == "__main__":
    main()
