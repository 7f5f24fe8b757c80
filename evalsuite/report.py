"""Reports a person reads (Markdown + PNG) next to the machine-readable results.json."""

from __future__ import annotations

import json
from pathlib import Path

from evalsuite.compare import rule


def strict(obj):
    """obj with every float that is not a number (NaN, infinity: a value nobody measured) as None, so that the
    JSON is strict (bare NaN is not JSON, and strict parsers reject it)."""
    if isinstance(obj, float):
        return obj if obj == obj and obj not in (float("inf"), float("-inf")) else None
    if isinstance(obj, dict):
        return {k: strict(v) for k, v in obj.items()}
    return [strict(v) for v in obj] if isinstance(obj, (list, tuple)) else obj


def dumps(obj, **kw) -> str:
    """Strict JSON (see strict): what every result file and --json output is written with."""
    return json.dumps(strict(obj), allow_nan=False, **kw)


def write_json(path: Path, obj: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(dumps(obj, indent=1, ensure_ascii=False))
    tmp.replace(path)  # atomic: a killed run never leaves half a file


NOT_MEASURED = "not measured"


def _q(d: dict | None, key: str, fmt: str = ".2e") -> str:
    """A summary's quantile, or "not measured" where the summary holds no values."""
    v = (d or {}).get(key)
    return NOT_MEASURED if v is None or v != v else format(v, fmt)


def run_text(r: dict) -> str:
    """`evalsuite run`'s text: the verdict with its reason, accuracies, warnings."""
    accs = ", ".join(f"{k} {v['accuracy']:.3f}" for k, v in r["engines"].items())
    p = r["paired"]
    data = "bundled sample" if r["dataset"]["bundled_sample"] else r["dataset"]["path"]
    lines = [f"{r['verdict']}: {r['task']}/{r['variant']} on {r['items']} items ({data}): {accs}; "
             f"b={p['b']} c={p['c']}, diff CI [{p['diff_ci'][0]:+.3f}, {p['diff_ci'][1]:+.3f}], margin {p['margin']}",
             f"  {p['explanation']}"]
    if "parity" in r.get("failed_by", []):
        lines.append("  FAIL through the parity part: the engine's answers part from the judge's beyond the rule's "
                     "bounds (a bug, whatever the accuracy says)")
    lines += _parity_lines(r.get("parity"), r.get("judge_work"))
    lines += [f"  to settle it: {r['settle']}"] if r.get("settle") else []
    lines += [f"  {r['shard_note']}"] if r.get("shard_note") else []
    if r.get("merged_from"):
        lines.append(f"  merged from {len(r['merged_from'])} shards: {', '.join(r['merged_from'])}")
    lines += [f"  warning: {w}" for w in r.get("warnings", [])]
    return "\n".join(lines)


def _parity_lines(pa: dict | None, work: dict | None) -> list[str]:
    """The parity part and the judge's work, a line or few of run's text."""
    if not pa:
        return []
    if not pa.get("run"):
        return [f"  parity: not run ({pa['why']})"]
    how = "judged" if pa["judged"] else f"reported, not judged ({pa['why_not_judged']})"
    lines = [f"  parity ({how}): {pa['items_identical']}/{pa['items']} answers identical to the judge's, "
             f"{pa['positions']} positions; {pa['items_failing']} items with real mismatches, "
             f"{pa['benign_divergences']} benign divergences"]
    for f in pa["first_failures"][:3]:
        tok = f", engine token {f['engine_token']}, judge token {f['reference_token']}" \
            if f.get("engine_token") is not None and f["kind"] == "token" else f", {f['note']}" if f.get("note") else ""
        what = "token mismatch" if f["kind"] == "token" else "logprobs beyond the bound, the same token"
        lines.append(f"    item {f['doc_id']}, position {f['position']}: {what}{tok}")
    if work and work.get("mode") == "scores":
        share = f"{work['decoded_share']:.1%}" if work.get("decoded_share") is not None else "n/a"
        lines.append(f"  judge: scored {work['judge_scored']} tokens of the engine's {work['engine_generated']}, "
                     f"decoded {work['judge_decoded']} itself ({share}) on {work['items_decoded']} items")
    return lines


def diff_report(result: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "results.json", result)
    png = out / "dlogit.png"
    _plot(result, png)
    r = result
    lines = [
        f"# evalsuite diff: {r['engine']} vs {r['against']} on {r['model']} — **{r['verdict']}**", "",
        f"- engine dtype {r['dtype']} (reference float32), fault: {r['fault'] or 'none'}",
        f"- prompts: {r['prompts']} from `{r['prompt_set']}` (sha256 {r['prompt_set_sha256'][:12]}), "
        f"{r['max_new_tokens']} greedy tokens each, {r['positions']} positions",
        f"- weights sha256 {r['weights_sha256'][:16]}...",
        f"- **real mismatches: {r['real_mismatches']}**, benign divergences: {r['benign_divergences']}, "
        f"prompts identical: {r['prompts_identical']}/{r['prompts']}",
        f"  (token mismatches {r['real_token_mismatches']}, distribution mismatches "
        f"{r['distribution_mismatches']}: same token but |Δlogit|, KL or |Δlogprob| beyond its bound)",
        f"- tolerances {r['tolerances']}: {r['noise_tolerance_rule']}",
        *[f"- **tolerance overridden**: {k} {v['used']} (measured default {v['default']})"
          for k, v in r.get("tolerance_overrides", {}).items()],
        f"- bf16 drift: {_drift_text(r.get('bf16_drift'))}",
        *([f"- bf16 logit scale: {_scale_text(r['bf16_logit_scale'])}"]
          if (r.get("bf16_logit_scale") or {}).get("checked") else []),
        *([f"- conditioning witness: {_witness_text(r['conditioning_witness'])}"]
          if (r.get("conditioning_witness") or {}).get("prompts") else []),
        (f"- observed |Δlogit| where the argmax agrees: p50 {_q(r['observed_noise'], 'p50')}, "
         f"p99 {_q(r['observed_noise'], 'p99')}, max {_q(r['observed_noise'], 'max')}"
         if r["observed_noise"].get("n") else "- observed |Δlogit| where the argmax agrees: not measured (the "
         "engine returned no logits or logprobs to measure it on)"),
        (f"- KL(ref||engine) p99 {_q(r['summary']['kl'], 'p99')}, argmax agreement "
         f"{_q(r['summary'], 'argmax_agreement', '.4f')}" if "kl" in r["summary"] else
         f"- over an API: |Δlogprob| of the reference token bounded by {r.get('logprob_tolerance')}; argmax "
         f"agreement {_q(r['summary'], 'argmax_agreement', '.4f')}"),
        *([f"- **what kind of difference: {r['character']['kind']}**: {r['character']['explanation']}"]
          if r.get("character") and r["character"]["kind"] != "none" else []),
        *[f"- **not checked (no PASS without it)**: {n}" for n in r.get("not_checked", [])],
        *[f"- not checked: {n}" for n in r.get("checks_not_possible", [])],
        f"- batch invariance (B={r['batch_invariance']['batch']}): "
        f"{'yes' if r['batch_invariance']['invariant'] else 'NO'}; deterministic: "
        f"{'yes' if r['batch_invariance']['deterministic'] else 'NO'}",
        *([f"- {_required_invariance(r['batch_invariance_required'])}"] if r.get("batch_invariance_required") else []),
        *([f"- {_build_text(r['float32_build'])}"] if (r.get("float32_build") or {}).get("run") else []),
    ]
    lines += [f"- {x}" for x in _parts_lines(r)]
    b = r.get("bisection")
    if b:
        lines.append(f"- {_bisection_text(b)}")
    lines += ["", f"![per-position max |Δlogit|]({png.name})", "",
              "| prompt | kind | first divergence | ref token | engine token | gap to engine token | rank | class "
              "| real | benign | max Δlogit |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in r["per_prompt"]:
        f = p["first_divergence"]
        if p.get("compared_as") == "unresolved":  # text that could not be located in tokens: nothing was judged
            lines.append(f"| {p['id']} | {p['kind']} | not compared: text only, differs, no token ids | | | | | | "
                         f"{NOT_MEASURED} | {NOT_MEASURED} | {NOT_MEASURED} |")
            continue
        gap = f.get("gap_to_engine_token") if f else None
        cells = ([str(f["position"]), repr(f.get("reference_text", f["reference_token"])),
                  repr(f.get("engine_text", f["engine_token"])), NOT_MEASURED if gap is None else f"{gap:.3g}",
                  str(f.get("engine_token_rank_in_reference", "")), f["class"]]
                 if f else ["-", "", "", "", "", ""])
        lines.append(f"| {p['id']} | {p['kind']} | " + " | ".join(c.replace("|", "\\|") for c in cells)
                     + f" | {len(p['real_positions'])} | {len(p['benign_positions'])} | "
                       f"{_num(_first(p['tf']['max_dlogit'], p['tf']['max_dlogprob']))} |")
    md = out / "report.md"
    md.write_text("\n".join(lines) + "\n")
    return [md, out / "results.json", png]


def _drift_text(d: dict | None) -> str:
    if not d:
        return "n/a"
    if not d.get("checked"):
        return d.get("why", "not checked")
    return rule.drift_text(d)


def _first(*xs):
    return next((x for x in xs if x is not None), None)


def _num(x) -> str:
    return NOT_MEASURED if x is None or x != x else f"{x:.2e}"


def _plot(r: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5))
    measure = "max |Δlogit|"
    for p in r["per_prompt"]:
        pp = p.get("per_position") or {}
        vals = [float("nan") if v is None else max(v, 1e-12) for v in (pp.get("values") or [])]
        measure = pp.get("measure", measure)
        ax.plot(vals, lw=0.8, alpha=0.6)
        for j, m in p["margins_at_divergences"].items():
            j = int(j)
            y = vals[j] if j < len(vals) else r["noise_tolerance"]
            real = j in p["real_positions"]
            ax.scatter([j], [y], marker="x" if real else "o", s=40, color="red" if real else "orange", zorder=3)
            ax.annotate(f"gap {m:.2g}", (j, y), fontsize=6)
    ax.axhline(r["noise_tolerance"], color="gray", ls="--", lw=0.8,
               label="noise tolerance (bound on the reference's top-1/top-2 gap)")
    ax.set_yscale("log")
    ax.set_xlabel("generated position")
    ax.set_ylabel(f"{measure} (teacher-forced)")
    ax.set_title(f"{r['engine']} ({r['dtype']}, fault={r['fault']}) vs reference on {r['model']}: "
                 f"{r['verdict']}\nx real mismatch, o benign divergence, label: reference top-1/top-2 gap",
                 fontsize=10)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def verify_markdown(r: dict) -> str:
    """The verify report for people (report.md): a row per part, run or not, and only measured figures."""
    parts, overall, warnings = r["parts"], r["verdict"], r["warnings"]
    engine, dtype, fault, model = r["engine"], r["dtype"], r["fault"], r["model"]
    lines = [f"# evalsuite verify: {engine} ({dtype}, fault={fault or 'none'}) on {model} — **{overall}**", "",
             f"Benchmark data: {r.get('data', 'bundled samples')}.", "",
             "| part | verdict | figures |", "|---|---|---|"]
    for name, p in parts.items():
        lines.append(f"| {name} | {p['verdict']} | {_part_figures(name, p)} |")
    for name in r.get("parts_not_run", []):
        lines.append(f"| {name} | not run | left out by --parts |")
    if overall != "PASS":
        lines += ["", f"**Why {overall}:**"]
        for name, p in parts.items():
            if p["verdict"] in ("FAIL", "INCONCLUSIVE"):
                why = (f"not checked: {p['not_checked']}" if p.get("not_checked") else
                       p["paired"]["explanation"] if "paired" in p else "; ".join(p.get("problems") or []) or
                       "; ".join(p.get("warnings") or []) or "see its section")
                lines.append(f"- {name}: {why}" + (f". To settle it: {p['settle']}" if p.get("settle") else ""))
    if warnings:
        lines += ["", "**Warnings:**", *[f"- {w}" for w in warnings]]
    return "\n".join(lines) + "\n"


def _part_figures(name: str, p: dict) -> str:
    if p.get("not_checked"):
        return f"not checked: {p['not_checked']}".replace("|", "\\|")
    if name == "golden":
        s = p.get("summary") or {}
        if not s:
            return "; ".join(p.get("problems") or []) or NOT_MEASURED
        return f"{s.get('positions', 0)} positions, max abs Δlogprob {_q(s, 'max_dlogprob')}"
    if name == "diff":
        return (f"{p['real_mismatches']} real, {p['benign_divergences']} benign, {p['prompts_identical']}/"
                f"{p['prompts']} prompts identical (diff/report.md)")
    acc = ", ".join(f"{k} {_q({'v': v}, 'v', '.3f')}" for k, v in p["accuracy"].items())
    sample = " (bundled sample)" if p["bundled_sample"] else f" ({p['dataset']})"
    lo = p["paired"].get("loss_upper")
    return (f"{p['items']} items{sample}: {acc}; b={p['paired']['b']} c={p['paired']['c']}, "
            + (f"loss <= {lo:.3f} at 97.5%" if lo is not None else f"loss bound {NOT_MEASURED}"))


def diff_text(r: dict) -> str:
    """`evalsuite diff`'s verdict and the lines that explain it."""
    lines = [f"{r['verdict']}: {r['engine']} ({r['dtype']}, fault={r['fault']}) vs reference on {r['model']}: "
             f"{r['real_mismatches']} real mismatches, {r['benign_divergences']} benign divergences over "
             f"{r['positions']} positions ({r['prompts_identical']}/{r['prompts']} prompts identical); "
             f"noise tolerance {r['noise_tolerance']}"]
    for k, v in r.get("tolerance_overrides", {}).items():
        lines.append(f"tolerance overridden: {k} {v['used']} (measured default {v['default']})")
    d = r.get("bf16_drift") or {}
    if d.get("checked"):
        lines.append(f"bf16 drift against the reference's bf16 recipe: {rule.drift_text(d)}")
    if (r.get("bf16_logit_scale") or {}).get("checked"):
        lines.append(f"bf16 logit scale: {_scale_text(r['bf16_logit_scale'])}")
    if (r.get("conditioning_witness") or {}).get("prompts"):
        lines.append(f"conditioning witness: {_witness_text(r['conditioning_witness'])}")
    ch = r.get("character")
    if ch and ch["kind"] != "none":
        lines.append(f"what kind of difference: {ch['kind']}: {ch['explanation']}")
    if r.get("batch_invariance_required"):
        lines.append(_required_invariance(r["batch_invariance_required"]))
    if (r.get("float32_build") or {}).get("run"):
        lines.append(_build_text(r["float32_build"]))
    lines += [f"NOT CHECKED (no PASS without it): {n}" for n in r.get("not_checked", [])]
    lines += [f"not checked: {n}" for n in r.get("checks_not_possible", [])]
    lines += _parts_lines(r)
    b = r.get("bisection")
    if b:
        lines.append(_bisection_text(b))
    return "\n".join(lines)


def _parts_lines(r: dict) -> list[str]:
    """The batching part, the engine paths it drove, and the bf16 recipe check, a line each."""
    from evalsuite.compare import coverage, speculation

    out = []
    b = r.get("batching") or {}
    if b.get("run"):
        flagged = [p["id"] for p in b["per_prompt"] if p["real_positions"]]
        out.append(f"batching part ({len(b['calls'])} calls, {b['prompts']} prompt runs, staggered stops, "
                   f"{b['seconds']} s): {b['real_mismatches']} real mismatches"
                   + (f" in {', '.join(flagged[:4])}" if flagged else ""))
    elif b:
        out.append(f"batching part: not run ({b.get('why')})")
    if r.get("paths"):
        out.append(f"engine paths: {coverage.text(r['paths'])}")
    if (r.get("engine_stats") or {}).get("speculation"):
        out.append(speculation.text(r["engine_stats"]["speculation"]))
    out += [f"engine self-check, {c['name']}: {'ok' if c['ok'] else 'FAILED'} ({c['detail']})"
            for c in r.get("engine_self_checks") or []]
    rc = r.get("bf16_recipe")
    if rc and rc.get("checked"):
        f = rc["first_over"]
        out.append(f"bf16 recipe check (against the reference in the engine's declared recipe, "
                   f"{len(rc['prompts'])} prompts): " + ("ok at every layer" if f is None else
                   f"FAILED at layer {f['layer']} on {f['prompts_over']} of {len(rc['prompts'])} prompts (worst "
                   f"{f['prompt']}: median element error {f['engine']:.3g} > bound {f['bound']:.3g}, other orders "
                   f"at most {f['orders_max']:.3g})"))
    return out


def _bisection_text(b: dict) -> str:
    ctx = b.get("context")
    where = (f" (batch of {ctx['batch']}, row {ctx['row']}, after {ctx['decoded_steps']} decode steps)"
             if isinstance(ctx, dict) and "batch" in ctx else f" ({ctx['found_in']})" if isinstance(ctx, dict) else "")
    return (f"bisection: prompt {b['prompt']} position {b['position']}{where}: first layer out of tolerance "
            f"{b['layer'] if b['layer'] is not None else 'none'}; reproduced {b.get('reproduced', 'n/a')}")


def _build_text(b: dict) -> str:
    """The bf16 diff's float32 build of the engine (evalsuite/compare/build.py), in one line."""
    failing = ", ".join(map(str, b["failing_prompts"][:3]))
    return (f"float32 build of the engine: {b['verdict']}: {b['real_mismatches']} real mismatches over "
            f"{b['positions']} positions ({b['prompts_identical']}/{b['prompts']} prompts identical)"
            + (f"; failing prompts: {failing}" if failing else "")
            + (" (a code bug the bf16 rounding hides)" if b["verdict"] == "FAIL" else ""))


def _required_invariance(s: dict) -> str:
    head = (f"batch invariance (required; batch sizes {s['batch_sizes'][0]}-{s['batch_sizes'][-1]}, "
            f"{len(s['prompts'])} prompts, order seed {s['seed']}): ")
    if s["ok"]:
        return head + "every row bitwise equal to its batch-1 run"
    d = s["differences"][0]
    where = (f"token {d['alone']} alone, {d['batched']} batched" if d["what"] == "token"
             else f"top-k logprobs differ by up to {d['max_abs']:.3g}")
    return head + (f"BROKEN in {len(s['differences'])} rows; first: prompt {d['prompt']} at batch {d['batch']} "
                   f"row {d['row']}, step {d['step']}: {where}")


def diff_slim(r: dict) -> dict:
    """`evalsuite diff --json`: the result without per-position arrays."""
    slim = {k: v for k, v in r.items() if k != "per_prompt"}
    slim["per_prompt"] = [{k: v for k, v in p.items() if k not in ("tf", "per_position")}
                          | {"max_dlogit": p["tf"]["max_dlogit"], "max_dlogprob": p["tf"]["max_dlogprob"]}
                          for p in r["per_prompt"]]
    return slim


def golden_text(results: dict) -> str:
    """`evalsuite golden check`: per model its verdict, figures, problems, what was not checked and what it covers."""
    from evalsuite.compare import coverage

    lines = []
    for m, r in results.items():
        s = r["summary"]
        figures = f" ({s['positions']} positions, max |Δlogprob| {s['max_dlogprob']:.2e})" if s else ""
        lines.append(f"{r['verdict']} {m}{figures}")
        lines += [f"  {p}" for p in r["problems"]]
        lines += [f"  not checked: {n}" for n in r["not_checked"]]
        b = (s or {}).get("float32_build")  # bf16: the engine's float32 build, checked too
        lines += [f"  float32 build: {b.get('verdict') or 'not run: ' + b['why']}"] if b else []
        lines += [f"  measure: {s['measure']}"] if s and s.get("measure") else []
        if s and s.get("scope"):
            lines.append(f"  covers: {s['scope']}")
            lines.append(f"  engine paths: {coverage.text(s['paths'])}")
    return "\n".join(lines)


def engines_text(rows: list[dict]) -> str:
    """`evalsuite engines`: what is installed under the evalsuite.engines entry-point group."""
    lines = []
    for r in rows:
        src = f"{r['target']}  [{r['distribution'] or '?'} {r['version'] or ''}]".rstrip()
        if r["ok"]:
            faults = f"; faults: {', '.join(r['faults'])}" if r["faults"] else ""
            opts = f"; --engine-option keys: {', '.join(r['options'])}" if r.get("options") else ""
            kind = " (server: needs --base-url)" if r["server"] else ""
            lines.append(f"{r['name']:<12} {src}{kind}{faults}{opts}")
            if r["doc"]:
                lines.append(f"{'':<12} {r['doc']}")
        else:
            lines.append(f"{r['name']:<12} {src}  BROKEN: {r['error']}")
    return "\n".join(lines)


def models_text(rows: list[dict]) -> str:
    """`evalsuite models`: name, family, parameters, weight sha256 (or the error), source."""
    out = []
    for r in rows:
        params = f"{r['params'] / 1e6:8.2f}M" if r["params"] else "       ?"
        out.append(f"{r['name']:<14} {r['family']:<6} {params}  {(r['sha256'] or r.get('error'))[:64]}  {r['source']}")
    return "\n".join(out)


def _scale_text(s: dict) -> str:
    return (f"engine - recipe slope {s['engine_minus_recipe']:+.2e} over {s['prompts']} prompts, t {s['t']:+.1f} "
            f"(FAIL needs |t| > {s['t_bound']} and |slope| > {s['effect_bound']:.2e}): "
            f"{'ok' if s['ok'] else 'a systematic logit-scale error'}")


def _witness_text(w: dict) -> str:
    return (f"{w['positions_cleared']} of {w['positions_flagged']} flagged positions cleared by the judge's own "
            f"error there ({w['measured']}: largest |Δlogit| {w['max_judge_own_dlogit'] or 0:.2e}); "
            f"{w['not_run']} prompt(s) not witnessed"
            + (f"; {w['prompts_with_other_orders']} prompt(s) also judged by the recipe's other reduction orders"
               if w.get("prompts_with_other_orders") else "")
            + (f"; {w['routing_flip_cleared']} of the cleared against the reference on the other side of a float32 "
               "routing near-tie" if w.get("routing_flip_cleared") else ""))
