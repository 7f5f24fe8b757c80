"""Noise floors behind evalsuite/compare/rule.py's tolerances: prints figures, asserts nothing.

    .venv/bin/python benchmarks/calibrate_noise.py [builtin|quick]

The floors are measured on the REFERENCE only (its score path against its decode path in float32;
its bf16 recipe against its float32), then the megakernel (faithful and with bf16_residual) is
measured for information, never to set a bound. About 6 minutes on the builtin set, 2 cores.
"""
import sys
import time

import numpy as np

from engines.megakernel import MegakernelEngine
from engines.reference import ReferenceEngine
from evalsuite.compare import metrics
from evalsuite.prompts import load_prompts
from evalsuite.registry import load_model

pset = sys.argv[1] if len(sys.argv) > 1 else "quick"
N = 32
m = load_model("smollm2-135m")
ps = [p.encode(m.tokenizer) for p in load_prompts(pset).prompts]
t=time.time()
r32 = ReferenceEngine(m.weights, "float32")
gen = r32.generate(ps, N, top_k=5, want_logits=True)
toks = [g.token_ids for g in gen]
L32 = np.concatenate([g.logits for g in gen])
print("ref gen", time.time()-t, flush=True)
def stats(name, A, B):
    d = np.abs(A - B).max(-1)
    kl = metrics.kl(A, B)
    print(f"{name:40s} max|dl| {d.max():.3e} p99 {np.percentile(d, 99):.3e} mean {d.mean():.3e}  "
          f"KLmax {kl.max():.3e} KLp99 {np.percentile(kl, 99):.3e} KLmean {kl.mean():.3e}", flush=True)
    return d, kl
# f32 floor: score path vs generate path
sc = np.concatenate([r32.score([p + t[:-1]])[0].logits[len(p)-1:] for p, t in zip(ps, toks)])
stats("ref32 score vs ref32 generate", L32, sc)
fo = np.concatenate(r32.decode_forced(ps, toks))
stats("ref32 forced vs ref32 generate", L32, fo)
rb = ReferenceEngine(m.weights, "bfloat16")
B16 = np.concatenate(rb.decode_forced(ps, toks))
stats("ref16 forced vs ref32", L32, B16)
B16s = np.concatenate([rb.score([p + t[:-1]])[0].logits[len(p)-1:] for p, t in zip(ps, toks)])
stats("ref16 score vs ref16 forced", B16, B16s)
res = {}
for dt, f in [("float32", None), ("bfloat16", None), ("bfloat16", "bf16_residual"), ("float32", "bf16_residual")]:
    t=time.time()
    e = MegakernelEngine(m.weights, dt, fault=f)
    E = np.concatenate(e.decode_forced(ps, toks))
    stats(f"mk {dt} {f} vs ref32", L32, E)
    if dt == "bfloat16":
        stats(f"mk {dt} {f} vs ref16", B16, E)
    print("  t", time.time()-t, flush=True)
