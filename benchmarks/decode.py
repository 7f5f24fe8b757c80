"""Decode benchmark for the reference engine on smollm2-135m float32 (prints figures, asserts nothing).

    python benchmarks/decode.py [--steps N]

Figures: the machine's read bandwidth (measured here, same run), the batch-1 floor (weight bytes
per step / bandwidth), decode ms/token at batch 1 and its ratio to the floor, tokens/s at batch 8
and 32 and their ratio to batch 1, prefill tokens/s, and the number of compilations during the
timed decode loop (must be 0: shapes are bucketed).
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np


def read_bandwidth_gbs(nbytes: int = 1 << 30, repeats: int = 5) -> float:
    """Best-of-N GB/s of summing a float32 array far larger than any cache (numpy, all cores)."""
    a = np.ones(nbytes // 4, np.float32)
    a.sum()
    best = min(_timed(lambda: a.sum()) for _ in range(repeats))
    return nbytes / best / 1e9


def _timed(fn) -> float:
    t = time.perf_counter()
    out = fn()
    jax.block_until_ready(out) if isinstance(out, jax.Array | tuple) else None
    return time.perf_counter() - t


def decode_seconds(eng, batch: int, steps: int, slots: int = 256) -> tuple[float, int]:
    """Median seconds per decode step at a batch size (cache of `slots` positions, 32 filled)."""
    kc, vc = eng.new_cache(batch, slots)
    tok = jnp.zeros((batch,), jnp.int32)
    pos = jnp.full((batch,), 32, jnp.int32)
    out = eng._decode(eng.params, tok, pos, kc, vc, k=5, want_logits=False)  # compile
    jax.block_until_ready(out)
    kc, vc = out[-2:]
    compiles_before = eng._decode._cache_size()
    times = []
    for i in range(steps):
        t = time.perf_counter()
        out = eng._decode(eng.params, out[0], pos + i, kc, vc, k=5, want_logits=False)
        jax.block_until_ready(out)
        times.append(time.perf_counter() - t)
        kc, vc = out[-2:]
    return float(np.median(times)), eng._decode._cache_size() - compiles_before


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from engines.reference import ReferenceEngine
    from evalsuite.registry import load_model

    m = load_model("smollm2-135m")
    eng = ReferenceEngine(m.weights, "float32")
    bw = read_bandwidth_gbs()
    weight_bytes = m.weights.nbytes
    floor_ms = weight_bytes / (bw * 1e9) * 1e3
    r = {"model": "smollm2-135m", "dtype": "float32", "read_bandwidth_GBps": bw,
         "weight_bytes": weight_bytes, "floor_ms_per_token_b1": floor_ms}
    b1, c1 = decode_seconds(eng, 1, args.steps)
    r["decode_ms_per_token_b1"] = b1 * 1e3
    r["ratio_to_floor_b1"] = b1 * 1e3 / floor_ms
    r["recompiles_in_decode_loop"] = c1
    for b in (8, 32):
        s, c = decode_seconds(eng, b, args.steps)
        r[f"tokens_per_s_b{b}"] = b / s
        r[f"ratio_b{b}_vs_b1_tokens_per_s"] = (b / s) / (1 / b1)
        r["recompiles_in_decode_loop"] += c
    prompt = np.random.default_rng(0).integers(100, 40000, size=256).tolist()
    eng.generate([prompt], 1)  # compile the 256 bucket
    t = min(_timed(lambda: eng.generate([prompt], 1)) for _ in range(3))
    r["prefill_tokens_per_s_256"] = 256 / t
    if args.json:
        print(json.dumps(r, indent=1))
        return
    print(f"read bandwidth            {bw:8.1f} GB/s (numpy sum of 1 GiB, best of 5)")
    print(f"weights                   {weight_bytes / 1e6:8.1f} MB float32")
    print(f"floor, batch 1            {floor_ms:8.1f} ms/token")
    print(f"decode, batch 1           {r['decode_ms_per_token_b1']:8.1f} ms/token  "
          f"({r['ratio_to_floor_b1']:.2f}x floor; target <= 1.6x)")
    for b in (8, 32):
        print(f"decode, batch {b:<2}          {r[f'tokens_per_s_b{b}']:8.1f} tokens/s "
              f"({r[f'ratio_b{b}_vs_b1_tokens_per_s']:.1f}x batch 1)")
    print(f"prefill 256 tokens        {r['prefill_tokens_per_s_256']:8.1f} tokens/s")
    print(f"recompiles in decode loop {r['recompiles_in_decode_loop']:8d}")


if __name__ == "__main__":
    main()
