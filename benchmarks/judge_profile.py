"""Where the judge's batch-32 decode step spends its time: XLA's own per-operation trace of the reference's step
(jax.profiler with XLA CPU's TraceMe events): how much of the cores' time any operation ran, what each kind of
operation took (the matmuls XLA hands to YNNPACK, its own dots, top-k, the rest), and the matmuls' rate a thread.

    XLA_FLAGS=--xla_cpu_enable_xprof_traceme=true .venv/bin/python -m benchmarks.judge_profile \
        [--model smollm2-135m] [--batch 32] [--steps 5] [--results benchmarks/results/judge-profile-MODEL-RUN.json]

Prints figures, asserts nothing. The groups are by XLA's operation names (GROUPS).
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import re
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from benchmarks.judge_peak import SQUARE, matmul_gflops, token_flops
from engines.base import next_pow2

# XLA CPU's per-operation events (their names, a trailing ".N" dropped): the matmuls XLA hands to YNNPACK, its own
# dots (the attention's), the top-k custom call, and the rest; events that contain others or wait are not operations
GROUPS = (("matmuls (YNNPACK fusions)", re.compile(r"^ynn_fusion")), ("dots (attention)", re.compile(r"^dot")),
          ("top-k and argmax", re.compile(r"^custom-call|^iota_reduce")))
NOT_OPS = re.compile(r"^(ThunkExecutor|SlinkyThreadPool|PjitFunction|CommonPjRt|PjRt|XlaModule|\$)")


def group_of(name: str) -> str:
    return next((g for g, rx in GROUPS if rx.search(name)), "other operations (norms, RoPE, copies, scatter)")


def trace_events(folder: Path) -> list[dict]:
    """The complete events of the perfetto trace jax.profiler wrote under folder, each with its thread's name."""
    paths = sorted(folder.rglob("*.json.gz"))
    if not paths:
        raise SystemExit(f"error: jax.profiler wrote no trace JSON under {folder}")
    doc = json.loads(gzip.open(paths[-1]).read())
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    return [{**e, "thread": str(threads.get((e["pid"], e["tid"]), e["tid"]))} for e in events
            if e.get("ph") == "X" and "dur" in e]


def measure(name: str, batch: int, steps: int) -> dict:
    from benchmarks.decode import step_seconds
    from engines.reference import ReferenceEngine
    from evalsuite.models import load_model

    if "xla_cpu_enable_xprof_traceme=true" not in os.environ.get("XLA_FLAGS", ""):
        raise SystemExit("error: set XLA_FLAGS=--xla_cpu_enable_xprof_traceme=true (XLA's per-operation events)")
    m = load_model(name)
    c = m.config
    ref = ReferenceEngine(m.weights, "float32")
    peak = matmul_gflops(SQUARE, SQUARE, SQUARE, 5, use_numpy=True)  # this run's peak (the machine's speed moves)
    alone = matmul_gflops(batch, c.hidden, c.ffn, 20)  # the MLP's up projection alone, its weights in cache
    untraced, _ = step_seconds(ref, batch, 10, slots=256, context=16)  # judge_peak's step, timed without the trace
    context = 16
    bundle = ref.steps()
    lengths = np.full((batch,), context, np.int32)
    *out, state = bundle.prefill(np.full((batch, next_pow2(context, 16)), 100, np.int32), lengths, 256, 5, False)
    ids = np.asarray(out[0])
    for i in range(3):  # compiled and warm
        *out, state = bundle.decode(ids, lengths + i, state, 5, False)
    jax.block_until_ready(out[0])
    folder = Path(tempfile.mkdtemp(prefix="judge-profile-"))
    t = time.perf_counter()
    with jax.profiler.trace(str(folder), create_perfetto_trace=True):
        for i in range(steps):
            *out, state = bundle.decode(ids, lengths + 3 + i, state, 5, False)
            jax.block_until_ready(out[0])
    wall = (time.perf_counter() - t) / steps
    ops = [e for e in trace_events(folder) if e["thread"].startswith("tf_XLA") and not NOT_OPS.search(e["name"])]
    groups: dict[str, dict] = {}
    for e in ops:
        g = groups.setdefault(group_of(e["name"]), {"thread_seconds": 0.0, "count": 0})
        g["thread_seconds"] += e["dur"] / 1e6 / steps
        g["count"] += 1 / steps
    busy = sum(g["thread_seconds"] for g in groups.values())
    cpus = os.cpu_count() or 1
    proj = batch * (token_flops(c, context, True) - 4 * c.n_heads * c.head_dim * (context + 1) * c.n_layers)
    mm = groups.get(GROUPS[0][0], {}).get("thread_seconds", 0.0)
    return {"model": name, "batch": batch, "steps": steps, "cpus": cpus, "peak_numpy_square_gflops": peak,
            "jax_up_projection_alone_gflops": alone, "step_seconds": untraced,
            "step_gflops": batch * token_flops(c, context, True) / untraced / 1e9,
            "step_seconds_traced": wall, "busy_thread_seconds": busy,
            # the share of the cores' time an operation ran, against the untraced step (tracing 2,700 operations a
            # step slows the step itself more than any one of them)
            "core_utilisation": busy / (untraced * cpus),
            "groups": {k: {**v, "share_of_busy": v["thread_seconds"] / busy} for k, v in groups.items()},
            "step_gflop": batch * token_flops(c, context, True) / 1e9,
            "matmul_gflops_per_busy_thread": (proj / mm / 1e9) if mm else None,  # projections and the LM head
            "weights_sha256": m.weights.sha256}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--results", help="also write the figures as JSON here")
    args = ap.parse_args()
    if args.results and not Path(args.results).parent.is_dir():
        raise SystemExit(f"error: --results {args.results}: no directory {Path(args.results).parent}")
    r = measure(args.model, args.batch, args.steps)
    print(f"{r['model']} float32, batch {r['batch']}: {r['step_seconds'] * 1e3:.1f} ms a step "
          f"({r['step_seconds_traced'] * 1e3:.1f} traced), {r['step_gflop']:.2f} GFLOP; XLA's operations ran "
          f"{r['busy_thread_seconds'] * 1e3:.1f} ms of thread time, {r['core_utilisation']:.0%} of {r['cpus']} cores' "
          "time in the untraced step")
    print(f"  {r['step_gflops']:.0f} GFLOP/s, {r['step_gflops'] / r['peak_numpy_square_gflops']:.2f}x this run's "
          f"peak ({r['peak_numpy_square_gflops']:.0f}, numpy {SQUARE}^3); the up projection alone at batch "
          f"{r['batch']}: {r['jax_up_projection_alone_gflops']:.0f}")
    for g, v in sorted(r["groups"].items(), key=lambda kv: -kv[1]["thread_seconds"]):
        print(f"  {g:<48} {v['thread_seconds'] * 1e3:7.1f} ms  {v['share_of_busy']:.0%}  ({v['count']:.0f} a step)")
    if r["matmul_gflops_per_busy_thread"]:
        print(f"  the projections' and LM head's FLOPs over the YNNPACK fusions' thread time: "
              f"{r['matmul_gflops_per_busy_thread']:.0f} GFLOP/s a thread")
    if args.results:
        from evalsuite.versions import versions

        doc = {"benchmark": "judge_profile", "command": f"python -m benchmarks.judge_profile --model {args.model} "
               f"--batch {args.batch} --steps {args.steps}", "measured_on": datetime.date.today().isoformat(),
               "xla_flags": os.environ.get("XLA_FLAGS", ""), **r, "versions": versions()}
        Path(args.results).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
