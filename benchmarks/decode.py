"""Decode benchmark on smollm2-135m float32: reference vs megakernel (prints figures, asserts nothing).

    python benchmarks/decode.py [--steps N] [--json]

Figures, all measured in the same run: the machine's read bandwidth, the batch-1 floor (weight
bytes per step / bandwidth), the reference's decode ms/token at batch 1 (ratio to the floor) and
tokens/s at batch 8 and 32 (ratio to batch 1), prefill tokens/s, the megakernel's (generic
interpret) ms/step at batch 1 and 8 with its ratio to the reference, TPU-interpret seconds per
step on the mini configs, and the number of compilations inside the timed loops (must be 0).
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import numpy as np


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


def step_seconds(eng, batch: int, steps: int, slots: int = 256) -> tuple[float, int]:
    """Median seconds of one decode step through the engine's step function, and compilations
    that happened inside the timed loop."""
    tokens = np.full((batch, 16), 100, np.int32)
    lengths = np.full((batch,), 16, np.int32)
    *out, state = eng._prefill_step(tokens, lengths, slots, 5, False)
    ids = np.asarray(out[0])
    *out, state = eng._decode_step(ids, lengths, state, 5, False)  # compile
    jax.block_until_ready(out[0])
    before = eng._decode._cache_size()
    times = []
    for i in range(steps):
        t = time.perf_counter()
        *out, state = eng._decode_step(ids, lengths + 1 + i, state, 5, False)
        jax.block_until_ready(out[0])
        times.append(time.perf_counter() - t)
    return float(np.median(times)), eng._decode._cache_size() - before


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from engines.megakernel import MegakernelEngine
    from engines.reference import ReferenceEngine
    from evalsuite.registry import load_model

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
    for b in (8, 32):
        r[f"ref_tokens_per_s_ratio_b{b}_vs_b1"] = (b / ref_s[b]) * ref_s[1]
    prompt = np.random.default_rng(0).integers(100, 40000, size=256).tolist()
    ref.generate([prompt], 1)  # compile the 256 bucket
    r["ref_prefill_tokens_per_s_256"] = 256 / min(_timed(lambda: ref.generate([prompt], 1)[0].top_ids)
                                                  for _ in range(3))
    for b in (1, 8):
        s, c = step_seconds(mk, b, max(5, args.steps // 3))
        r[f"mk_ms_per_step_b{b}"] = s * 1e3
        r[f"mk_ratio_vs_ref_b{b}"] = s / ref_s[b]
        r["recompiles"] += c
    for name in ("mini-llama", "mini-moe"):
        tpu = MegakernelEngine(load_model(name).weights, interpret="tpu")
        s, _ = step_seconds(tpu, 1, 3, slots=64)
        r[f"tpu_interpret_s_per_step_{name}"] = s
    if args.json:
        print(json.dumps(r, indent=1))
        return
    print(f"read bandwidth                 {bw:8.1f} GB/s (numpy sum of 1 GiB, best of 5)")
    print(f"weights                        {m.weights.nbytes / 1e6:8.1f} MB float32")
    print(f"floor, batch 1                 {floor_ms:8.1f} ms/token")
    print(f"reference decode, batch 1      {r['ref_ms_per_step_b1']:8.1f} ms/token "
          f"({r['ref_ratio_to_floor_b1']:.2f}x floor; target <= 1.6x)")
    for b in (8, 32):
        print(f"reference decode, batch {b:<2}     {r[f'ref_tokens_per_s_b{b}']:8.1f} tokens/s "
              f"({r[f'ref_tokens_per_s_ratio_b{b}_vs_b1']:.1f}x batch 1; target at 32: >= 10x)")
    print(f"reference prefill, 256 tokens  {r['ref_prefill_tokens_per_s_256']:8.1f} tokens/s")
    for b in (1, 8):
        print(f"megakernel decode, batch {b}     {r[f'mk_ms_per_step_b{b}']:8.1f} ms/step "
              f"({r[f'mk_ratio_vs_ref_b{b}']:.2f}x reference; target <= 2x)")
    for name in ("mini-llama", "mini-moe"):
        print(f"TPU interpret, {name:<10}      {r[f'tpu_interpret_s_per_step_{name}']:8.3f} s/step (batch 1)")
    print(f"recompiles in timed loops      {r['recompiles']:8d}")


if __name__ == "__main__":
    main()
