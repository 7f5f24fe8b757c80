"""Golden outputs: the reference's greedy tokens and top-k logprobs, pinned in versioned files.

golden/<model>.json = {"format_version", "header": {...how it was produced...}, "entries": {id: ...}}.
`update` writes them from the float32 reference; `check` compares any engine against them
teacher-forced along the golden tokens, with the tie-aware rule of `diff`: an argmax that differs
where the golden top-1/top-2 logprob gap is below the noise tolerance is benign, else a mismatch.
Missing, stale (weights, prompt set or settings changed) and unused entries fail, saying which
and how to regenerate.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from engines.base import Forced, Generation
from engines.errors import ModelError
from evalsuite import distributed
from evalsuite.compare import coverage, rule
from evalsuite.compare.replay import judge_ties
from evalsuite.compare.routing import routing_margins, routing_ties
from evalsuite.compare.rule import Tolerances, compare_prompt
from evalsuite.compare.witness import Flagged, OrderSpread, with_witness
from evalsuite.compare.witness import summary as witness_summary
from evalsuite.errors import SpecError
from evalsuite.models import load_model
from evalsuite.prompts import load_prompts
from evalsuite.results import GoldenResult
from evalsuite.roles import JUDGE
from evalsuite.versions import versions

FORMAT_VERSION = 1
TOP_K = 5
# Per-model golden settings: the prompt set and the number of greedy tokens pinned.
DEFAULTS = {"smollm2-135m": ("builtin", 32), "mini-llama": ("quick", 24), "mini-moe": ("quick", 24),
            "mini-qwen2": ("quick", 24), "mini-gemma2": ("quick", 24), "mini-gemma3": ("quick", 24),
            "mini-gptoss": ("quick", 24), "mini-qwen-hybrid": ("quick", 24), "mini-qwen-lownorm": ("quick", 24),
            "mini-kimi-linear": ("quick", 24), "mini-deepseek-mla": ("quick", 24),
            "mini-kimi": ("quick", 24), "mini-muse": ("quick", 24), "mini-qwen-next-moe": ("quick", 24),
            "gemma3-270m": ("quick", 24)}
# |Δ logprob| of the golden top-k ids beyond LOGPROB_TOL (evalsuite/compare/rule.py, from noise
# floors measured on the reference) is a mismatch even when the argmax agrees, in every dtype.
REGENERATE = "regenerate with: evalsuite golden update --model {model}  (or pytest --golden-update)"


def default_models() -> tuple[list[str], dict[str, str]]:
    """The models a bare `golden check` / `golden update` takes: every one with golden settings but the real models
    not installed here (install.sh --models), which come back as {name: why} to report as skipped."""
    from evalsuite.real_models import REAL_MODELS, real_model_path

    models, skipped = [], {}
    for m in DEFAULTS:
        try:
            if m in REAL_MODELS:
                real_model_path(m)
            models.append(m)
        except ModelError as e:
            skipped[m] = str(e)
    return models, skipped


def golden_dir() -> Path:
    """The golden/ package's folder (at the project root in a checkout, in site-packages in a wheel)."""
    from importlib.resources import files

    return Path(str(files("golden")))


def golden_path(model: str, directory: Path | None = None) -> Path:
    return (directory or golden_dir()) / f"{model}.json"


def _settings(model: str) -> tuple[str, int]:
    if model not in DEFAULTS:
        raise SpecError(f"no golden settings for model {model!r}; goldens exist for {', '.join(DEFAULTS)}")
    return DEFAULTS[model]


def fitting(model, pset, n: int) -> list:
    """The set's prompts that fit the model's context with n tokens after them (a golden file pins only those; the
    rest are skipped as diff skips them, and named in the header)."""
    return [p for p in pset.prompts if len(p.encode(model.tokenizer)) + n <= model.config.max_context]


def update(model_name: str, directory: Path | None = None) -> Path:
    from evalsuite.plugins import judge

    set_name, n = _settings(model_name)
    model = load_model(model_name)
    pset = load_prompts(set_name)
    ref = judge(model)  # on evalsuite --mesh when given (a model too big for one device): recorded below
    kept = fitting(model, pset, n)
    ids = [p.encode(model.tokenizer) for p in kept]
    gens = ref.generate(ids, n, top_k=TOP_K)
    doc = {
        "format_version": FORMAT_VERSION,
        "header": {"model": model_name, "weights_sha256": model.weights.sha256, "engine": JUDGE,
                   "dtype": "float32", "prompt_set": set_name, "prompt_set_sha256": pset.sha256,
                   "settings": {"max_new_tokens": n, "top_k": TOP_K, "greedy": True, "stop_ids": []},
                   "seed": 0, "seed_note": "greedy decoding makes no random choice; recorded for the format",
                   "versions": versions(), "produced_by": "evalsuite golden update",
                   "skipped": [p.id for p in pset.prompts if p not in kept],
                   **({"mesh": dict(ref.mesh.shape)} if ref.mesh is not None else {})},
        "entries": {p.id: {"prompt_token_ids": i, "token_ids": g.token_ids,
                           "top_ids": g.top_ids.tolist(),
                           "top_logprobs": [[round(float(x), 6) for x in row] for row in g.top_logprobs]}
                    for p, i, g in zip(kept, ids, gens)},
    }
    path = golden_path(model_name, directory)
    if not distributed.writes_files():  # a multi-process run: process 0 writes, the others computed the same
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)
    return path


def _failed(model: str, problems: list[str]) -> GoldenResult:
    return GoldenResult(model=model, ok=False, problems=tuple(problems))


class _Invalid(Exception):
    """The golden file cannot be used as it is: its problems, each saying how to regenerate."""

    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = problems


def _pinned(model_name: str, directory: Path | None):
    """The golden file's entries for the prompts the model's context fits, checked against the current weights,
    prompt set, settings and tokenizer; raises _Invalid with every problem found."""
    set_name, n = _settings(model_name)
    path = golden_path(model_name, directory)
    regen = REGENERATE.format(model=model_name)
    if not path.is_file():
        raise _Invalid([f"missing golden file {path}; {regen}"])
    try:
        doc = json.loads(path.read_text())
        header, entries = doc["header"], doc["entries"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise _Invalid([f"unreadable golden file {path} ({e}); {regen}"]) from None
    if doc.get("format_version") != FORMAT_VERSION:
        raise _Invalid([f"{path}: format_version {doc.get('format_version')} != {FORMAT_VERSION}; {regen}"])
    model, pset = load_model(model_name), load_prompts(set_name)
    stale = [f"{k}: golden {header.get(k)!r} != current {v!r}" for k, v in (
        ("weights_sha256", model.weights.sha256), ("prompt_set_sha256", pset.sha256),
        ("prompt_set", set_name)) if header.get(k) != v]
    if header.get("settings", {}).get("max_new_tokens") != n or header.get("settings", {}).get("top_k") != TOP_K:
        stale.append(f"settings: golden {header.get('settings')} != current max_new_tokens {n}, top_k {TOP_K}")
    if stale:
        raise _Invalid([f"stale golden {path}: " + "; ".join(stale) + f"; {regen}"])
    kept = fitting(model, pset, n)
    want_ids = [p.id for p in kept]
    missing = [i for i in want_ids if i not in entries]
    unused = [i for i in entries if i not in want_ids]
    problems = ([f"missing golden entries {missing} in {path}; {regen}"] if missing else []) + (
        [f"unused golden entries {unused} in {path} (not in prompt set {set_name}); {regen}"] if unused else [])
    if problems:
        raise _Invalid(problems)
    return model, path, kept, want_ids, entries


def _judges(entries: dict, want_ids: list[str]) -> list[Forced]:
    """The golden file as the judge's records: its top-k, and the pinned token's logprob (-inf: not in the top-k)."""
    judges = []
    for i in want_ids:
        ent = entries[i]
        vals, ids = np.asarray(ent["top_logprobs"], np.float64), np.asarray(ent["top_ids"])
        tok_lp = [vals[j, list(ids[j]).index(t)] if t in ids[j] else -np.inf for j, t in enumerate(ent["token_ids"])]
        judges.append(Forced(np.asarray(tok_lp), ids, vals))
    return judges


def _bf16_checks(model, eng, prompts, conts, judges, forced, recs, tol) -> tuple:
    """`diff`'s run-wide bf16 checks along the golden tokens, each measured against the reference in the engine's
    declared bf16 recipe (its default where the engine declares none; the default's bf16 router made a correct
    engine with a float32 router FAIL mini-muse's golden file, where the engine equals its declared recipe bitwise):
    drift (a precision bug under the per-position bounds moves every position), logit scale (a systematic
    error under the drift bound: it let final_norm_eps PASS mini-llama's golden file), and on MoE models the
    routing near-ties, not judged (without it the reference's own bf16 recipe failed mini-moe's and mini-gptoss's
    golden files at 3/264 positions each), replayed with the engine's routing where it reports it (replay.py).
    Returns (drift, scale, routing, the recipe's records, the float32 reference's full logits or None)."""
    from evalsuite.plugins import judge

    caps, recipe = eng.capabilities, judge(model, "bfloat16", recipe=eng.recipe)
    own = recipe.forced_topk(prompts, conts, TOP_K, want_logits=caps.logits)
    own_recs = [compare_prompt(c, jd, o, None, tol) for c, jd, o in zip(conts, judges, own)]
    measures = {r.drift_measure for r in recs} | {r.drift_measure for r in own_recs}
    drift = rule.drift_check([r.drift for r in recs], [r.drift for r in own_recs], "bfloat16",
                             measures.pop() if len(measures) == 1 else "mixed")
    ref = judge(model) if caps.logits or model.config.n_moe_layers else None
    exact = ref.forced_topk(prompts, conts, TOP_K, want_logits=True) if caps.logits else None
    scale = _scale(exact, forced, own) if caps.logits else {
        "checked": False, "why": "bf16 logit-scale check (rule.SCALE): the engine gives no full logits"}
    routing = _routing_ties(ref, recipe, prompts, conts, own_recs, recs) if model.config.n_moe_layers else None
    if routing and routing["positions_not_judged"]:  # replayed with the engine's own routing where it reports it
        orders = OrderSpread(lambda seed: judge(model, "bfloat16", order_seed=seed, recipe=eng.recipe),
                             model.weights.nbytes)
        routing["left"] = judge_ties(ref, recipe, eng, prompts, conts, recs, tol, routing, orders)
    return drift, scale, routing, own, exact


def _witnessed(model, eng, prompts, conts, judges, forced, recs, own, exact, tol) -> tuple[list, dict]:
    """diff's bf16 conditioning witness (compare/witness.py) along the golden tracks: a prompt's flagged positions
    judged again against the golden file with bounds widened by the recipe's own error there (its full logits
    against the float32 reference's, which wrote the golden file), then by its other reduction orders where flags
    survive. Without it a faithful engine failed mini-qwen-lownorm's golden file at tile-128@1, where the recipe
    is as far from float32 (4.56 in logprob) as the engine. Measured on the judge alone, never on the engine."""
    from evalsuite.plugins import judge

    flagged = [i for i, rec in enumerate(recs) if rec["real_positions"]]
    if not flagged:
        return recs, witness_summary([], "bfloat16")
    ref, witnessed, out = judge(model), [], list(recs)
    orders = OrderSpread(lambda seed: judge(model, "bfloat16", order_seed=seed, recipe=eng.recipe),
                         model.weights.nbytes)
    for i in flagged:
        rg = Generation(list(prompts[i]), list(conts[i]), judges[i].top_ids, judges[i].top_logprobs, "length",
                        logits=exact[i].logits if exact else None)
        case = Flagged(prompts[i], rg, forced[i], None, recs[i], track=judges[i], recipe=own[i])
        out[i] = with_witness(ref, case, tol, witnessed, orders)
        ties = set(recs[i].get("routing_ties") or ())  # judged again from scratch: the routing ties stay out
        for key in ("real_positions", "token_mismatches", "distribution_mismatches") if ties else ():
            out[i][key] = [j for j in out[i][key] if j not in ties]
    return out, witness_summary(witnessed, "bfloat16")


def _problems(summary: dict, mismatches: list, drift, scale, regen: str) -> list[str]:
    """What fails the check, one sentence each."""
    problems = []
    if drift and drift["checked"] and not drift["ok"]:
        problems.append(f"bf16 drift against the golden file: {rule.drift_text(drift)}")
    if scale and scale["checked"] and not scale["ok"]:
        problems.append(f"bf16 logit scale: the engine's logits are scaled {scale['engine_minus_recipe']:+.3g} "
                        f"against the reference's own bf16 recipe's (t {scale['t']:.3g}, {scale['prompts']} prompts; "
                        f"bound {scale['effect_bound']:.3g} at |t| > {scale['t_bound']}): an error that moves every "
                        "position the same way")
    if mismatches:
        total = summary["positions"]
        where = ", ".join(f"{i}@{j}" for i, j in mismatches[:5]) + (" ..." if len(mismatches) > 5 else "")
        problems.append(f"{len(mismatches)}/{total} positions ({100 * len(mismatches) / total:.2f}%) mismatch "
                        f"the golden file ({where}); max |Δlogprob| {summary['max_dlogprob']:.3g}, mean "
                        f"{summary['mean_dlogprob']:.3g}. If the reference changed on purpose, {regen}")
    return problems


def _not_checked(caps, drift, scale, routing) -> list[str]:
    """What a PASS would need and this check could not show."""
    out = list(caps.not_checked(uses_forced=True))
    if routing and routing.get("left"):
        out.append(routing["left"])  # positions not judged, not replayed: they could hide a routing bug
    if drift and not drift["checked"]:
        out.append(f"bf16 drift: {drift['why']}")
    if scale and not scale["checked"]:  # as in `diff`
        out.append(scale["why"])
    return out


SCOPE = ("teacher-forced along the golden tokens: the engine's free-running decode and its batching paths "
         "(refill, shrink, stop, shared prefix) are not judged here; `evalsuite diff` drives and judges them")


def check(model_name: str, engine_name: str = JUDGE, dtype: str = "float32", fault: str | None = None,
          directory: Path | None = None, extra: dict | None = None, float32_build: bool = True) -> GoldenResult:
    """Any engine teacher-forced along the golden tokens and judged by the one comparator (evalsuite/compare/rule.py):
    the golden file is the judge's record (top-k), the engine gives full logits where it has them, else its top-k.
    bfloat16: the engine's float32 build is checked too (_with_float32_build)."""
    result = _check(model_name, engine_name, dtype, fault, directory, extra)
    return _with_float32_build(result, model_name, engine_name, fault, directory, extra, float32_build) \
        if dtype == "bfloat16" and result.summary else result


def _with_float32_build(result: GoldenResult, model_name, engine_name, fault, directory, extra, on: bool):
    """diff's float32 build (compare/build.py) along the golden tracks: a code bug far under bf16 rounding is in
    the engine's float32 build too, where float32's bounds see it (l2_eps_outside PASSed mini-qwen-lownorm's golden
    file in bf16 and fails 279 of its 288 positions in float32). Its FAIL is the check's FAIL; where it cannot run
    that is said, beside a verdict that never rested on it."""
    from evalsuite.plugins import engine_class

    why = "turned off (--no-float32-build)" if not on else engine_class(engine_name).no_float32_build
    if why:
        return replace(result, summary={**result.summary, "float32_build": {"run": False, "why": why}})
    try:
        r32 = _check(model_name, engine_name, "float32", fault, directory, extra)
    except (SpecError, ModelError) as e:  # the bf16 check ran: what fails here is the float32 build
        why = f"it could not be built: {e}"
    except Exception as e:  # a plugin's float32 path raised: the finished bf16 check is not lost to it
        why = f"it raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": ")
    if why:
        return replace(result, summary={**result.summary, "float32_build": {"run": False, "why": why}})
    s32 = r32.summary
    summary = {"run": True, "verdict": r32.verdict, "positions": s32.get("positions"),
               "mismatching_positions": s32.get("mismatching_positions"), "max_dlogprob": s32.get("max_dlogprob"),
               "not_checked": list(r32.not_checked)}
    return replace(result, ok=result.ok and r32.ok,
                   problems=(*result.problems, *(f"the engine's float32 build: {p}" for p in r32.problems)),
                   summary={**result.summary, "float32_build": summary})


def _check(model_name: str, engine_name: str, dtype: str, fault: str | None, directory: Path | None,
           extra: dict | None) -> GoldenResult:
    """One dtype's check (check's, without the float32 build)."""
    from evalsuite.plugins import make_engine

    try:
        model, path, kept, want_ids, entries = _pinned(model_name, directory)
    except _Invalid as e:
        return _failed(model_name, e.problems)
    regen = REGENERATE.format(model=model_name)
    eng = make_engine(engine_name, model, dtype, fault, extra)
    prompts = [entries[i]["prompt_token_ids"] for i in want_ids]
    changed = [f"entry {i}: prompt tokenizes differently now (tokenizer changed?); {regen}"
               for p, e, i in zip(kept, prompts, want_ids) if p.encode(model.tokenizer) != e]
    if changed:
        return _failed(model_name, changed)
    conts, caps, tol = [entries[i]["token_ids"] for i in want_ids], eng.capabilities, Tolerances.for_dtype(dtype)
    forced = eng.forced_topk(prompts, conts, TOP_K, want_logits=caps.logits)
    judges = _judges(entries, want_ids)
    recs = [compare_prompt(c, jd, got, None, tol) for c, jd, got in zip(conts, judges, forced)]
    drift, scale, routing, witnessed = None, None, None, None
    if dtype == "bfloat16":
        drift, scale, routing, own, exact = _bf16_checks(model, eng, prompts, conts, judges, forced, recs, tol)
        recs, witnessed = _witnessed(model, eng, prompts, conts, judges, forced, recs, own, exact, tol)
    dlp = [v for rec in recs for v in rec["tf"]["dlogprob"]]
    mismatches = [(i, j) for i, rec in zip(want_ids, recs) for j in rec["real_positions"]]
    summary = {"positions": len(dlp), "mismatching_positions": len(mismatches),
               "mismatch_share": len(mismatches) / max(len(dlp), 1),
               "benign_divergences": sum(len(rec["benign_positions"]) for rec in recs),
               "max_dlogprob": float(np.nanmax(dlp)), "mean_dlogprob": float(np.nanmean(dlp)),
               "engine": engine_name, "dtype": dtype, "fault": fault, "golden": str(path),
               "measure": ("|Δlogprob| of every golden top-5 id (the engine's full logits)" if caps.logits else
                           f"|Δlogprob| of the golden token and the engine's top-1 (teacher-forced by its "
                           f"{caps.forced_path} path); other top-5 logprobs not available"),
               "engine_capabilities": caps.report(),
               # what a golden PASS covers: teacher-forced positions only, so the engine's free-running and
               # batching paths (refill, shrink, stop, shared prefix) are said, not judged (`diff` drives them)
               "scope": SCOPE, "paths": coverage.report(eng),
               **({"routing": {k: v for k, v in routing.items() if k != "tied"}} if routing else {}),
               **({"bf16_drift": drift, "bf16_logit_scale": scale} if drift else {}),
               **({"conditioning_witness": witnessed} if witnessed is not None else {}),
               "engine_self_checks": eng.self_checks()}  # the megakernel's race detector in TPU interpret mode
    problems = _problems(summary, mismatches, drift, scale, regen) + [
        f"engine self-check failed: {c['name']} ({c['detail']})" for c in summary["engine_self_checks"] if not c["ok"]]
    return GoldenResult(model=model_name, ok=not problems, problems=tuple(problems), summary=summary,
                        not_checked=tuple(_not_checked(caps, drift, scale, routing)))


def _scale(exact, forced, own) -> dict:
    """rule.scale_check along the golden tracks: the engine's and the recipe's logit slope on the float32
    reference's full logits (exact), per prompt."""
    return rule.scale_check([rule.logit_slope(x.logits, f.logits) for x, f in zip(exact, forced)],
                            [rule.logit_slope(x.logits, o.logits) for x, o in zip(exact, own)], "bfloat16")


def _routing_ties(ref, recipe, prompts, conts, own_recs, recs) -> dict:
    """routing.routing_ties over the golden tracks: margins from the float32 reference (what wrote the golden
    file) and its bf16 recipe, and the recipe's own positions beyond the bounds (own_recs: the witness), all
    measured on the reference alone, never on the engine being checked."""
    margins = {k: routing_margins(ref, recipe, p, c) for k, (p, c) in enumerate(zip(prompts, conts))}
    return routing_ties(recs, margins, witness={k: r["real_positions"] for k, r in enumerate(own_recs)})
