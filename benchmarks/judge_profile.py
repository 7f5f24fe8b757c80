"""Where the judge's batch-32 decode step (or, --pass prefill, its prefill) spends its time: XLA's own per-operation
trace of the reference's call (jax.profiler with XLA CPU's TraceMe events): how much of the cores' time any
operation ran, what each kind of operation took (the matmuls XLA hands to YNNPACK, its own dots, top-k, the rest),
and the matmuls' rate a thread.

    XLA_FLAGS=--xla_cpu_enable_xprof_traceme=true .venv/bin/python -m benchmarks.judge_profile \
        [--model smollm2-135m] [--pass decode|prefill] [--batch 32] [--steps 5] \
        [--results benchmarks/results/judge-profile[-prefill]-MODEL-RUN.json]

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

from benchmarks.judge_peak import PREFILL, SQUARE, best, matmul_gflops, token_flops
from engines.base import next_pow2

# XLA CPU's per-operation events (their names, a trailing ".N" dropped): the matmuls XLA hands to YNNPACK, its own
# dots (the attention's), the top-k custom call, and the rest; events that contain others or wait are not operations
GROUPS = (("matmuls (YNNPACK fusions)", re.compile(r"^ynn_fusion")),
          ("dots (XLA's own: attention; at batch 1 the projections too)", re.compile(r"^dot")),
          ("top-k and argmax", re.compile(r"^custom-call|^iota_reduce")),
          # the megakernel in the generic interpreter: each DMA of a weight or KV tile into VMEM scratch is a copy
          ("dynamic-slice copies (the interpreter's DMAs)", re.compile(r"^dynamic-slice")))
NOT_OPS = re.compile(r"^(ThunkExecutor|SlinkyThreadPool|ThreadpoolListener|PjitFunction|CommonPjRt|PjRt|XlaModule"
                     r"|end: |\$)")


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


def self_seconds(events: list[dict]) -> list[float]:
    """Each event's own duration in seconds, less the events it contains on its thread (a while loop's or a
    conditional's body: the megakernel's step nests its operations in them), so that no time counts twice."""
    own = [e["dur"] for e in events]
    by_thread: dict = {}
    for i, e in enumerate(events):
        by_thread.setdefault(e["thread"], []).append(i)
    for idx in by_thread.values():
        idx.sort(key=lambda i: (events[i]["ts"], -events[i]["dur"]))
        open_: list[int] = []
        for i in idx:
            while open_ and events[open_[-1]]["ts"] + events[open_[-1]]["dur"] <= events[i]["ts"]:
                open_.pop()
            if open_:
                own[open_[-1]] -= events[i]["dur"]
            open_.append(i)
    return [max(o, 0.0) / 1e6 for o in own]


def profile_ops(run, steps: int) -> tuple[float, dict]:
    """run(i) traced `steps` times (each call waited for inside run): the seconds a call took traced, and each
    group's thread seconds (self time: nested operations counted once) and operation count a call, from XLA's
    per-operation events."""
    folder = Path(tempfile.mkdtemp(prefix="judge-profile-"))
    t = time.perf_counter()
    with jax.profiler.trace(str(folder), create_perfetto_trace=True):
        for i in range(steps):
            run(i)
    wall = (time.perf_counter() - t) / steps
    ops = [e for e in trace_events(folder) if e["thread"].startswith("tf_XLA") and not NOT_OPS.search(e["name"])]
    groups: dict[str, dict] = {}
    for e, own in zip(ops, self_seconds(ops)):
        g = groups.setdefault(group_of(e["name"]), {"thread_seconds": 0.0, "count": 0})
        g["thread_seconds"] += own / steps
        g["count"] += 1 / steps
    return wall, groups


def projection_flops(c, rows: int) -> float:
    """The layers' projections (QKV, output, the MLP's three) over `rows` tokens: what YNNPACK's fusions run."""
    D, H, K, hd, F = c.hidden, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn
    return rows * c.n_layers * (2 * D * (H * hd + 2 * K * hd) + 2 * H * hd * D + 2 * 3 * D * F)


def decode_pass(ref, c, batch: int):
    """The decode step at `batch` rows (of any engine with steps()): (untraced seconds a step, run(i) for the trace,
    FLOPs a step, of them the projections' and the LM head's, the up projection alone at these rows in GFLOP/s)."""
    from benchmarks.decode import step_seconds

    alone = matmul_gflops(batch, c.hidden, c.ffn, 20)  # the MLP's up projection alone, its weights in cache
    untraced, _ = step_seconds(ref, batch, 10, slots=256, context=16)  # judge_peak's step, timed without the trace
    context = 16
    bundle = ref.steps()
    lengths = np.full((batch,), context, np.int32)
    *out, state = bundle.prefill(np.full((batch, next_pow2(context, 16)), 100, np.int32), lengths, 256, 5, False)
    ids = np.asarray(out[0])
    st = {"state": state}
    for i in range(3):  # compiled and warm
        *out, st["state"] = bundle.decode(ids, lengths + i, st["state"], 5, False)
    jax.block_until_ready(out[0])

    def run(i):
        *out, st["state"] = bundle.decode(ids, lengths + 3 + i, st["state"], 5, False)
        jax.block_until_ready(out[0])

    flops = batch * token_flops(c, context, True)
    return untraced, run, flops, projection_flops(c, batch) + batch * 2 * c.hidden * c.vocab_size, alone


def prefill_pass(ref, c):
    """judge_peak's prefill (PREFILL prompts of random ids, one token generated): as decode_pass."""
    n, T = PREFILL
    alone = matmul_gflops(T, c.hidden, c.ffn, 5)  # the up projection at a prompt's rows, its weights in cache
    prompts = np.random.default_rng(0).integers(100, c.vocab_size - 1, size=(n, T)).tolist()
    untraced = best(lambda: ref.generate(prompts, 1)[0].top_ids, 2)

    def run(i):
        jax.block_until_ready(ref.generate(prompts, 1)[0].top_ids)

    head = n * 2 * c.hidden * c.vocab_size  # each prompt's last position's logits
    flops = n * sum(token_flops(c, p, False) for p in range(T)) + head
    return untraced, run, flops, projection_flops(c, n * T) + head, alone


def measure(name: str, batch: int, steps: int, what: str = "decode", engine: str = "reference") -> dict:
    from engines.megakernel import MegakernelEngine
    from engines.reference import ReferenceEngine
    from evalsuite.models import load_model

    if "xla_cpu_enable_xprof_traceme=true" not in os.environ.get("XLA_FLAGS", ""):
        raise SystemExit("error: set XLA_FLAGS=--xla_cpu_enable_xprof_traceme=true (XLA's per-operation events)")
    if engine == "megakernel" and what != "decode":
        raise SystemExit("error: --engine megakernel: its prefill is XLA's, as the reference's; profile --pass decode")
    m = load_model(name)
    c = m.config
    ref = (MegakernelEngine if engine == "megakernel" else ReferenceEngine)(m.weights, "float32")
    peak = matmul_gflops(SQUARE, SQUARE, SQUARE, 5, use_numpy=True)  # this run's peak (the machine's speed moves)
    untraced, run, flops, proj, alone = decode_pass(ref, c, batch) if what == "decode" else prefill_pass(ref, c)
    wall, groups = profile_ops(run, steps)
    busy = sum(g["thread_seconds"] for g in groups.values())
    cpus = os.cpu_count() or 1
    mm = groups.get(GROUPS[0][0], {}).get("thread_seconds", 0.0)
    return {"model": name, "engine": engine, "pass": what,
            "profiled": "megakernel (generic interpreter)" if engine == "megakernel" else "",
            "batch": batch if what == "decode" else PREFILL[0],
            "tokens": batch if what == "decode" else PREFILL[0] * PREFILL[1], "steps": steps, "cpus": cpus,
            "peak_numpy_square_gflops": peak, "jax_up_projection_alone_gflops": alone, "step_seconds": untraced,
            "step_gflops": flops / untraced / 1e9, "step_seconds_traced": wall, "busy_thread_seconds": busy,
            # the share of the cores' time an operation ran, against the untraced step (tracing thousands of
            # operations a step slows the step itself more than any one of them)
            "core_utilisation": busy / (untraced * cpus),
            "groups": {k: {**v, "share_of_busy": v["thread_seconds"] / busy} for k, v in groups.items()},
            "step_gflop": flops / 1e9,
            "matmul_gflops_per_busy_thread": (proj / mm / 1e9) if mm else None,  # projections and the LM head
            "weights_sha256": m.weights.sha256}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=5, help="traced calls (decode steps, or prefills)")
    ap.add_argument("--pass", dest="what", choices=("decode", "prefill"), default="decode",
                    help="the batch-32 decode step, or judge_peak's prefill (4 x 1,024 tokens)")
    ap.add_argument("--engine", choices=("reference", "megakernel"), default="reference",
                    help="the judge, or the megakernel (generic interpreter; decode only)")
    ap.add_argument("--results", help="also write the figures as JSON here")
    args = ap.parse_args()
    if args.results and not Path(args.results).parent.is_dir():
        raise SystemExit(f"error: --results {args.results}: no directory {Path(args.results).parent}")
    r = measure(args.model, args.batch, args.steps, args.what, args.engine)
    what = f"decode, batch {r['batch']}" if args.what == "decode" else f"prefill, {r['tokens']:,} tokens"
    print(f"{r['model']} float32, {args.engine}, {what}: {r['step_seconds'] * 1e3:.1f} ms a call "
          f"({r['step_seconds_traced'] * 1e3:.1f} traced), {r['step_gflop']:.2f} GFLOP; XLA's operations ran "
          f"{r['busy_thread_seconds'] * 1e3:.1f} ms of thread time, {r['core_utilisation']:.0%} of {r['cpus']} cores' "
          "time in the untraced step")
    print(f"  {r['step_gflops']:.0f} GFLOP/s, {r['step_gflops'] / r['peak_numpy_square_gflops']:.2f}x this run's "
          f"peak ({r['peak_numpy_square_gflops']:.0f}, numpy {SQUARE}^3); the up projection alone at these rows: "
          f"{r['jax_up_projection_alone_gflops']:.0f}")
    for g, v in sorted(r["groups"].items(), key=lambda kv: -kv[1]["thread_seconds"]):
        print(f"  {g:<48} {v['thread_seconds'] * 1e3:7.1f} ms  {v['share_of_busy']:.0%}  ({v['count']:.0f} a call)")
    if r["matmul_gflops_per_busy_thread"]:
        print(f"  the projections' and LM head's FLOPs over the YNNPACK fusions' thread time: "
              f"{r['matmul_gflops_per_busy_thread']:.0f} GFLOP/s a thread")
    if args.results:
        from evalsuite.versions import versions

        doc = {"benchmark": "judge_profile", "command": f"python -m benchmarks.judge_profile --model {args.model} "
               f"--engine {args.engine} --pass {args.what} --batch {args.batch} --steps {args.steps}",
               "measured_on": datetime.date.today().isoformat(),
               "xla_flags": os.environ.get("XLA_FLAGS", ""), **r, "versions": versions()}
        Path(args.results).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
