"""Speed figures for the docs: docs/benchmarks.md's from benchmarks/results/decode.json (written by
`python -m benchmarks.decode --results benchmarks/results/decode.json`), docs/speculative.md's from
benchmarks/results/spec.json (`python -m benchmarks.spec --results benchmarks/results/spec.json`)."""

from __future__ import annotations

import json
from pathlib import Path

from evalsuite.doctables import _absent, _load, _source, _table

DECODE = "benchmarks/results/decode.json"


def decode_report(r: dict) -> list[str]:
    """benchmarks/decode.py's figures as its console and docs/benchmarks.md show them."""
    out = []
    bw, floor_ms = r["read_bandwidth_GBps"], r["floor_ms_per_token_b1"]
    out.append(f"read bandwidth                 {bw:8.1f} GB/s (numpy sum of 1 GiB, best of 5)")
    out.append(f"weights                        {r['weight_bytes'] / 1e6:8.1f} MB float32")
    out.append(f"floor, batch 1                 {floor_ms:8.1f} ms/token")
    out.append(f"reference decode, batch 1      {r['ref_ms_per_step_b1']:8.1f} ms/token "
          f"({r['ref_ratio_to_floor_b1']:.2f}x floor; target <= 1.0x)")
    for b in (8, 32):
        out.append(f"reference decode, batch {b:<2}     {r[f'ref_tokens_per_s_b{b}']:8.1f} tokens/s "
              f"({r[f'ref_tokens_per_s_ratio_b{b}_vs_b1']:.1f}x batch 1; target at 32: >= 15x)")
    out.append(f"  batch 32, 1000-token context {r['ref_tokens_per_s_b32_ctx1000']:8.1f} tokens/s "
          f"({r['ref_ms_per_step_b32_ctx1000']:.1f} ms/step, 2048-slot cache)")
    out.append(f"reference prefill, 256 tokens  {r['ref_prefill_tokens_per_s_256']:8.1f} tokens/s")
    out.append(f"reference prefill, 4 x 1024    {r['ref_prefill_tokens_per_s_4x1024']:8.1f} tokens/s")
    for b in (1, 8):
        out.append(f"megakernel decode, batch {b}     {r[f'mk_ms_per_step_b{b}']:8.1f} ms/step "
              f"({r[f'mk_ratio_vs_ref_b{b}']:.2f}x reference; target <= 1.5x)")
    for name in ("mini-llama", "mini-moe"):
        out.append(f"TPU interpret, {name:<10}      {r[f'tpu_interpret_s_per_step_{name}']:8.3f} s/step (batch 1)")
    out.append(f"recompiles in timed loops      {r['recompiles']:8d}")
    if "first_generate_s_cache_empty" in r:
        out.append(f"first generate, fresh process  {r['first_generate_s_cache_empty']:8.1f} s cache empty, "
              f"{r['first_generate_s_cache_filled']:.1f} s cache filled, "
              f"{r['first_generate_s_cache_off']:.1f} s cache off")
    return out


def decode_figures(root: Path) -> str:
    doc = _load(root, DECODE)
    if doc is None:
        return _absent(DECODE)
    return (_source(DECODE, how=f" (`{doc['command']}`, smollm2-135m float32, one run)") + "```\n"
            + "\n".join(decode_report(doc)) + "\n```\n")


SPEC = "benchmarks/results/spec.json"  # python -m benchmarks.spec --results ...


def spec_figures(root: Path) -> str:
    """The spec engine against plain greedy decoding by the same target, per drafter, from one run."""
    doc = _load(root, SPEC)
    if doc is None:
        return _absent(SPEC)
    rows = []
    for r in doc["rows"]:
        d = r.get("diff") or {}
        rates = ", ".join(f"{x:.2f}" for x in r["acceptance_rate_by_position"] or [])
        rows.append([f"`{r['drafter']}`", str(r["block"]), f"{r['acceptance_length']:.2f}", f"[{rates}]",
                     f"{r['target_steps']:,} for {r['tokens_committed']:,}",
                     f"{r['identical_prompts']} of {r['prompts']}",
                     f"{r['seconds']:.1f} against {r['plain_seconds']:.1f} ({r['speedup']:.2f}x)",
                     f"**{d['verdict']}** ({d['real_mismatches']} real of {d['positions']:,})" if d else "not run"])
    return (_source(SPEC, how=f" (`{doc['command']}`: {doc['model']} {doc['dtype']}, `{doc['prompt_set']}` prompts x "
                              f"{doc['max_new_tokens']} tokens)")
            + _table(["drafter", "block", "acceptance length", "acceptance rate by draft position",
                      "target steps for tokens", "tokens identical to plain", "seconds, plain (speedup)",
                      "`diff --engine spec`"], rows))


def _runs(root: Path, pattern: str) -> tuple[list[Path], list[dict]]:
    """A benchmark's runs, a file each (sorted by name), and their figures."""
    files = sorted(root.glob(pattern))
    return files, [json.loads(f.read_text("utf-8")) for f in files]


PEAK = "benchmarks/results/judge-peak-*.json"  # python -m benchmarks.judge_peak --results ... (a file a run)


def judge_peak_figures(root: Path) -> str:
    """The judge's prefill, scoring pass, batch-32 decode and LM head as shares of the matmul peak measured in the
    same run, a row per run (each run's own file)."""
    files, runs = _runs(root, PEAK)
    if not files:
        return _absent(PEAK)
    rows = []
    for r in runs:
        share = lambda k, r=r: f"{r[k]['gflops']:.0f} ({r[k]['share_of_square_peak']:.2f}x)"  # noqa: E731
        b1 = r["decode_b1"]
        rows.append([f"{r['model']}, {r['measured_on']}", f"{r['peak_numpy_square_gflops']:.0f}",
                     f"{r['peak_jax_square_gflops']:.0f}", share("prefill"), share("scoring"), share("decode_b32"),
                     share("head_topk_b32"), f"{b1['ms_per_step']:.1f} ({b1['ratio_to_floor']:.2f}x)",
                     f"{r['decode_b32']['speedup_vs_b1']:.1f}x"])
    return (_source(*[str(f.relative_to(root)) for f in files],
                    how=" (`python -m benchmarks.judge_peak`, float32; GFLOP/s and the share of the same run's "
                        "numpy peak)")
            + _table(["model, run", "peak: numpy 2048^3", "jax 2048^3", "prefill 4 x 1,024", "scoring pass 2 x 1,024",
                      "decode batch 32", "LM head + top-5, batch 32", "decode batch 1, ms (x read floor)",
                      "batch 32 / batch 1 tokens/s"], rows))


PROFILE = "benchmarks/results/judge-profile-*.json"  # python -m benchmarks.judge_profile --results ... (a file a run)


def judge_profile_figures(root: Path) -> str:
    """Where the judge's decode step and its prefill go (and the megakernel's step in the generic interpreter), by
    XLA's own per-operation trace, a row per run."""
    files, runs = _runs(root, PROFILE)
    if not files:
        return _absent(PROFILE)
    rows = []
    for r in runs:
        g = r["groups"]["matmuls (YNNPACK fusions)"]
        what = "prefill, 4 x 1,024" if r.get("pass") == "prefill" else f"decode, batch {r['batch']}"
        what += f", {r['profiled']}" if r.get("profiled") else ""  # an engine other than the judge
        kinds = sorted(((v["thread_seconds"], k.split(" (")[0]) for k, v in r["groups"].items()
                        if v["share_of_busy"] >= 0.05), reverse=True)
        per_thread = r["peak_numpy_square_gflops"] / r["cpus"]
        rate = f"{r['matmul_gflops_per_busy_thread']:.0f} of {per_thread:.0f}" if g["share_of_busy"] >= 0.5 else "-"
        rows.append([f"{r['model']}, {r['measured_on']}", what, f"{r['peak_numpy_square_gflops']:.0f}",
                     f"{r['step_seconds'] * 1e3:.1f}",
                     f"{r['step_gflops']:.0f} ({r['step_gflops'] / r['peak_numpy_square_gflops']:.2f}x)",
                     f"{r['core_utilisation']:.0%}", ", ".join(f"{k} {t * 1e3:.1f}" for t, k in kinds), rate,
                     f"{r['jax_up_projection_alone_gflops']:.0f}"])
    return (_source(*[str(f.relative_to(root)) for f in files],
                    how=" (`python -m benchmarks.judge_profile [--pass prefill] [--engine megakernel --batch 1]`, "
                        "float32, with XLA's TraceMe events)")
            + _table(["model, run", "pass", "peak: numpy 2048^3", "a call, ms", "GFLOP/s (x peak)", "cores busy",
                      "thread time by kind, ms a call (5% or more)",
                      "matmul GFLOP/s a thread (of a core's peak; where YNNPACK's matmuls are most of the time)",
                      "the up projection alone at the pass's rows, GFLOP/s"], rows))
