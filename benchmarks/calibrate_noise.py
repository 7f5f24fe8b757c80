"""Noise floors behind evalsuite/compare/rule.py's tolerances: prints figures, asserts nothing.

    .venv/bin/python -m benchmarks.calibrate_noise [builtin|quick|varied] [--json OUT]

The floors are measured on the REFERENCE only (its score path against its decode path in float32;
its bf16 recipe against its float32), then the megakernel (faithful and with bf16_residual) is
measured for information, never to set a bound (skipped for `varied`: the detection table and the
false-alarm run judge the engine there). About 6 minutes on the builtin set, 2 cores.

`varied`: 128 prompts of benchmarks/make_prompts.py's seeded set (raw and chat, up to 1,500 tokens,
code, numbers, unicode, repetition), the 65th to 192nd in benchmarks/detection.py's order (seed 0):
disjoint from the 64 prompts the detection table judges, drawn from the same distribution.
"""
import argparse
import json
import time
from pathlib import Path

import numpy as np

from engines.megakernel import MegakernelEngine
from engines.reference import ReferenceEngine
from evalsuite.compare import metrics
from evalsuite.models import load_model
from evalsuite.prompts import load_prompts
from evalsuite.versions import versions

ap = argparse.ArgumentParser()
ap.add_argument("pset", nargs="?", default="quick", choices=("builtin", "quick", "varied"))
ap.add_argument("--json", help="write the figures here")
a = ap.parse_args()
N = 32
m = load_model("smollm2-135m")
if a.pset == "varied":
    from benchmarks.detection import prompt_order

    ps = [ids for _, ids in prompt_order(m.tokenizer, 192, 0, m.config.max_context, N)[64:]]
else:
    ps = [p.encode(m.tokenizer) for p in load_prompts(a.pset).prompts]
print(f"{len(ps)} prompts, lengths {min(map(len, ps))}-{max(map(len, ps))} tokens", flush=True)
out = {"prompt_set": a.pset, "prompts": len(ps), "max_new_tokens": N, "model": m.name,
       "weights_sha256": m.weights.sha256, "versions": versions(), "figures": {}}
t = time.time()
r32 = ReferenceEngine(m.weights, "float32")
gen = r32.generate(ps, N, top_k=5, want_logits=True)
toks = [g.token_ids for g in gen]
L32 = np.concatenate([g.logits for g in gen])
owner = np.concatenate([[i] * len(g.token_ids) for i, g in enumerate(gen)])
print("ref gen", round(time.time() - t, 1), flush=True)


def stats(name, A, B):
    d = np.abs(A - B).max(-1)
    kl = metrics.kl(A, B)
    print(f"{name:40s} max|dl| {d.max():.3e} p99 {np.percentile(d, 99):.3e} mean {d.mean():.3e}  "
          f"KLmax {kl.max():.3e} KLp99 {np.percentile(kl, 99):.3e} KLmean {kl.mean():.3e}  "
          f"positions {len(d)}", flush=True)
    worst = int(np.argmax(d))
    out["figures"][name] = {"max_dlogit": float(d.max()), "p99_dlogit": float(np.percentile(d, 99)),
                            "mean_dlogit": float(d.mean()), "max_kl": float(kl.max()),
                            "p99_kl": float(np.percentile(kl, 99)), "mean_kl": float(kl.mean()),
                            "positions": int(len(d)), "worst_prompt_length": len(ps[owner[worst]])}
    return d, kl


# f32 floor: score path vs generate path
sc = np.concatenate([r32.score([p + t[:-1]])[0].logits[len(p) - 1:] for p, t in zip(ps, toks)])
stats("ref32 score vs ref32 generate", L32, sc)
fo = np.concatenate(r32.decode_forced(ps, toks))
stats("ref32 forced vs ref32 generate", L32, fo)
rb = ReferenceEngine(m.weights, "bfloat16")
B16 = np.concatenate(rb.decode_forced(ps, toks))
d16, _ = stats("ref16 forced vs ref32", L32, B16)
long_ = np.array([len(ps[i]) >= 512 for i in owner])
if long_.any() and (~long_).any():
    print(f"  ref16 vs ref32 max|dl|: prompts >= 512 tokens {d16[long_].max():.3e}, "
          f"shorter {d16[~long_].max():.3e}", flush=True)
B16s = np.concatenate([rb.score([p + t[:-1]])[0].logits[len(p) - 1:] for p, t in zip(ps, toks)])
stats("ref16 score vs ref16 forced", B16, B16s)
if a.pset != "varied":
    for dt, f in [("float32", None), ("bfloat16", None), ("bfloat16", "bf16_residual"), ("float32", "bf16_residual")]:
        t = time.time()
        e = MegakernelEngine(m.weights, dt, fault=f)
        E = np.concatenate(e.decode_forced(ps, toks))
        stats(f"mk {dt} {f} vs ref32", L32, E)
        if dt == "bfloat16":
            stats(f"mk {dt} {f} vs ref16", B16, E)
        print("  t", time.time() - t, flush=True)
if a.json:
    Path(a.json).write_text(json.dumps(out, indent=1))
