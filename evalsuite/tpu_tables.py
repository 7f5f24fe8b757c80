"""The megakernel's TPU tables in docs/tpu.md, rendered from benchmarks/results/roofline.json (written by
`python -m benchmarks.roofline --results`): bytes and FLOPs a decode step against the ideal, and its VMEM per chip."""

from __future__ import annotations

from pathlib import Path

from evalsuite.doctables import RESULTS, _absent, _acc, _load, _sci, _source, _table
from evalsuite.roles import JUDGE

ROOFLINE = "benchmarks/results/roofline.json"
MIB = 1 << 20


def tpu_roofline(root: Path) -> str:
    doc = _load(root, ROOFLINE)
    if doc is None:
        return _absent(ROOFLINE)
    rows = [[r["model"], r["dtype"], str(r["batch"]), str(r["context"]), f"{r['kernel_bytes'] / 1e6:,.1f}",
             f"{r['ideal_bytes'] / 1e6:,.1f}", f"{r['kernel_over_ideal']:.3f}", f"{r['flops'] / 1e9:,.2f}",
             f"{r['on_chip']['step_s'] * 1e3:,.3f} ({r['on_chip']['bound']})"] for r in doc["rows"]]
    k3 = doc["k3_paper"]
    paper = [f"- k3-sized on {k3['chips']} TPU v7 ({k3['hbm_bytes_per_s_chip'] / 1e9:,.0f} GB/s a chip), batch "
             f"{k3['batch']}, context {k3['context']:,}: {label}: {v['kernel_bytes'] / 1e9:,.1f} GB a step, "
             f"{v['step_ms']} ms, **{v['tokens_per_s']:,} tokens/s** (a paper number)"
             for label, v in k3["implied"].items()]
    paper.append(f"- Inferact reported {k3['reported_tokens_per_s']:g} tokens/s for Kimi K3 at batch 1 without "
                 f"speculation; {k3['note']}.")
    return (_source(ROOFLINE) + _table(["model", "dtype", "batch", "context", "kernel MB", "ideal MB",
                                        "kernel / ideal", "GFLOP", f"ms on one TPU {doc['chip']}"], rows)
            + "\n" + "\n".join(paper) + "\n")


def tpu_vmem(root: Path) -> str:
    doc = _load(root, ROOFLINE)
    if doc is None:
        return _absent(ROOFLINE)
    chips = list(dict.fromkeys(r["budget"]["chip"] for r in doc["vmem_batch8"]))
    cells: dict[tuple, dict] = {}
    for r in doc["vmem_batch8"]:
        cells.setdefault((r["model"], r["dtype"]), {})[r["budget"]["chip"]] = r["budget"]
    rows = []
    for (model, dtype), by_chip in cells.items():
        b = next(iter(by_chip.values()))
        top = ", ".join(f"{g} {n / MIB:,.1f}" for g, n in list(b["by_group"].items())[:3])
        rows.append([model, dtype, f"{b['limit_bytes'] / MIB:,.0f}", top,
                     *[("fits" if by_chip[c]["fits"] else "**refused**") + f" ({by_chip[c]['capacity_bytes'] // MIB})"
                       for c in chips]])
    return (_source(ROOFLINE, how=" (batch 8, attention tile 128)")
            + _table(["model", "dtype", "limit MiB", "largest parts (MiB)", *[f"TPU {c} (MiB)" for c in chips]], rows))


DIFFS = "megakernel-diff-*.json"  # `evalsuite diff --engine megakernel --model M --json > FILE` on real models
RUNS = "megakernel-run-*.json"  # `evalsuite run TASK --engine megakernel --model M --json > FILE` on real models


def _result_table(root: Path, pattern: str, how: str, head: list[str], row) -> str:
    """One row per committed result file matching pattern (row: its JSON -> cells), with the files named."""
    files = sorted((root / RESULTS).glob(pattern))
    if not files:
        return _absent(f"{RESULTS}/{pattern}")
    rows = [row(_load(root, f"{RESULTS}/{f.name}")) for f in files]
    return _source(*[f"{RESULTS}/{f.name}" for f in files], how=how) + _table(head, rows)


def _diff_row(d: dict) -> list[str]:
    s = d["spec"]
    return [d["model"], d["dtype"], f"`{s['prompts']}`, {s['max_new_tokens']} tokens", f"**{d['verdict']}**",
            f"{d['positions']:,}", str(d["real_mismatches"]), f"{d['prompts_identical']} of {d['prompts']}",
            _sci(d["summary"]["max_dlogit"]["max"]), "yes" if d["batching"]["run"] else "no", f"{d['seconds']:.0f}"]


def megakernel_diffs(root: Path) -> str:
    return _result_table(root, DIFFS, " (`evalsuite diff --engine megakernel --model M --json`, defaults otherwise)",
                         ["model", "dtype", "prompts", "verdict", "positions", "real mismatches", "identical",
                          "max abs. logit diff.", "batching part", "seconds"], _diff_row)


def _run_row(d: dict) -> list[str]:
    eng, p = d.get("engines") or {}, d.get("paired") or {}
    judged = next((e for name, e in eng.items() if name != JUDGE), {})
    return [d["model"], f"{d['task']} ({d['variant']})", f"{d['items']:,}", _acc(eng.get(JUDGE) or {}), _acc(judged),
            str(p.get("b")), str(p.get("c")), f"{p.get('loss_upper', float('nan')):.4f}", f"**{d['verdict']}**",
            f"{d['seconds']:,.0f}"]


def megakernel_runs(root: Path) -> str:
    """Paired benchmark runs of the megakernel against the reference on the real models: accuracies, the discordant
    pairs, the largest loss the verdict excludes, and the verdict."""
    return _result_table(root, RUNS, " (`evalsuite run TASK --engine megakernel --model M --data-dir "
                         "../shared/data/TASK --limit N --json`)",
                         ["model", "task", "items", "reference [95% Wilson]", "megakernel [95% Wilson]", "b (lost)",
                          "c (gained)", "loss at 97.5% at most", "verdict", "seconds"], _run_row)


TPU_RUN = "benchmarks/results/tpu-v5e.json"  # interop/tpu_check.py's summary from one TPU v5e host


def _probe_cell(r: dict | None) -> str:
    if r is None:
        return "not probed"
    if not r.get("ok"):
        return "**refused**: " + r.get("error", "?").split("\n")[0][:80]
    same = "tokens equal" if r["tokens_equal"] else f"tokens differ (first at {r['first_difference']})"
    return f"ran; {same}; top-1 logprob {_sci(r['max_top1_logprob_delta'])}"


def tpu_runs(root: Path) -> str:
    """What ran on a TPU: the reference against the CPU-made goldens at two matmul precisions, and the megakernel
    compiled by Mosaic beside the reference on the same chip, per MINI family."""
    doc = _load(root, TPU_RUN)
    if doc is None:
        return _absent(TPU_RUN)
    hi, lo = doc["golden_highest"]["models"], doc["golden_default"]["models"]
    probes = {(r["model"], r["dtype"]): r for r in doc["probe"]["rows"]}
    rows = []
    for m in dict.fromkeys([*hi, *(k[0] for k in probes)]):
        g = [f"{v['verdict']} ({v['mismatching_positions']}/{v['positions']}, {_sci(v['max_dlogprob'])})"
             if (v := d.get(m)) else "not run" for d in (hi, lo)]
        rows.append([m, *g, _probe_cell(probes.get((m, "float32"))), _probe_cell(probes.get((m, "bfloat16")))])
    head = ["model", "reference vs golden, precision highest (mismatching, max abs. logprob diff.)",
            "reference vs golden, the chip's default", "megakernel by Mosaic, float32 (vs the reference)",
            "megakernel by Mosaic, bfloat16"]
    return (_source(TPU_RUN, how=f" ({doc['device_kind']}, jax {doc['jax']})") + _table(head, rows)
            + _tpu_diffs(doc.get("diff") or {}) + "\nNot run there: " + "; ".join(doc["not_run"]) + ".\n")


def _tpu_diffs(diffs: dict) -> str:
    """`evalsuite diff` with the kernel compiled by Mosaic, judged by the reference on the same chip."""
    if not diffs:
        return "\n`evalsuite diff` through Mosaic: not run.\n"
    rows = []
    for key, r in diffs.items():
        if r["verdict"] is None:
            rows.append([key, "not finished", "-", "-", "-", "-", r["why"]])
            continue
        rows.append([key, f"**{r['verdict']}**", f"{r['positions']:,}", str(r["real_mismatches"]),
                     f"{r['prompts_identical']} of {r['prompts']}", _sci(r["max_dlogprob"]),
                     "; ".join(n.split(";")[0] for n in r["not_checked"]) or "-"])
    return ("\n`evalsuite diff --prompts quick --engine-option interpret=mosaic` on the chip (the megakernel compiled "
            "by Mosaic against the reference there; a \"spec verify step\" row is `--engine spec --engine-option "
            "target=megakernel --engine-option drafter=sweep --max-new-tokens 16`, its verify step compiled by Mosaic, "
            "against the reference's plain greedy decoding):\n\n"
            + _table(["model, dtype", "verdict", "positions", "real mismatches", "identical", "max abs. logprob diff.",
                      "not checked"], rows))


SEED_MINIS = "benchmarks/results/seed-minis.json"
# the same matrix with the public TPU kernels' bf16 rounding points (--engine-option rounds=public)
SEED_MINIS_PUBLIC = "benchmarks/results/seed-minis-public.json"


def seed_minis(root: Path, path: str = SEED_MINIS) -> str:
    """The seed MINIs through the megakernel (benchmarks/seed_minis.py): diff and golden check per model, dtype and
    interpret mode, with the race detector's word in TPU interpret mode."""
    doc = _load(root, path)
    if doc is None:
        return _absent(path)
    models = list(dict.fromkeys(r["model"] for r in doc["rows"]))
    order = {k: n for n, k in enumerate((m, d, i) for m in models for d in ("float32", "bfloat16")
                                        for i in ("generic", "tpu"))}
    cells: dict[tuple, dict] = {}
    for r in doc["rows"]:
        cells.setdefault((r["model"], r["dtype"], r["interpret"]), {})[r["command"]] = r

    def cell(r: dict | None) -> str:
        if r is None:
            return "not run"
        races = [c for c in r.get("self_checks") or [] if c["name"].startswith("race")]
        race = "" if not races else ", no race" if races[0]["ok"] else ", RACE"
        figures = f"{r.get('real', '-')}/{r.get('positions', '-')}, {_sci(r.get('max_dlogprob'))}"
        return f"**{r['verdict']}** ({figures}{race})"

    rows = [[m, d, i, cell(c.get("diff")), cell(c.get("golden"))]
            for (m, d, i), c in sorted(cells.items(), key=lambda kv: order.get(kv[0], 0))]
    how = ", ".join(f"{dt}: `--prompts {p} --max-new-tokens {n}`" for dt, (p, n) in doc["diff_settings"].items())
    opts = "".join(f" --engine-option {kv}" for kv in doc.get("engine_options") or [])
    return (_source(path, how=f" (`python -m benchmarks.seed_minis{opts}`; diff {how})")
            + "Each cell: verdict (real mismatches / positions, max |Δlogprob|; in TPU interpret mode the race "
              "detector's finding).\n\n"
            + _table(["model", "dtype", "interpret", "diff", "golden check"], rows))
