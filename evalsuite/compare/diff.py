"""`evalsuite diff`: greedy decoding through an engine against the float32 reference, token by token.

The parts, in order (docs/verdicts.md, "What a PASS covers"):
1. Main part: fixed batches of --batch prompts, N tokens, no stop; free-running, then teacher-forced along the
   reference's tokens; every position classified by the one comparator (rule.compare_prompt), flagged prompts
   judged again by the conditioning witness (witness.py).
2. Batching part (batching.py): every prompt in one call with staggered stops, so the engine refills, shrinks
   and splits its prefill as a benchmark makes it; prefix groups in calls of their own.
3. Engine paths (coverage.py): what the engine says ran; a declared path never driven keeps the verdict off PASS.
4. bf16: drift and logit scale against the reference's recipe, the recipe check against the engine's declared
   recipe (recipe_check.py), routing near-ties on MoE models (routing.py) replayed with the engine's own expert
   choice where it reports it (replay.py), the engine's float32 build on the fixed batches (build.py).
5. At the first real mismatch, bisection in the failing context, then alone (bisect.py).
6. Batch invariance and determinism (invariance.py); `--require batch-invariance` makes it a condition; and the
   engine's checks on itself (Engine.self_checks: the megakernel's race detector in TPU interpret mode).
Verdict: FAIL on a real mismatch (either part), bf16 drift, logit scale or recipe, non-determinism, a required
invariance broken, a self-check or float32 build failed; INCONCLUSIVE when a PASS's need was not shown; else PASS.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from evalsuite.compare import (
    batching,
    bisect,
    build,
    coverage,
    groups,
    invariance,
    metrics,
    recipe_check,
    replay,
    routing,
    rule,
    text,
    witness,
)
from evalsuite.errors import SpecError
from evalsuite.models import load_model
from evalsuite.plugins import judge, make_engine
from evalsuite.prompts import load_prompts
from evalsuite.results import DiffResult
from evalsuite.roles import DEFAULT_ENGINE, JUDGE
from evalsuite.versions import versions

REQUIRABLE = ("batch-invariance",)
# what cannot be measured without full logits or taps (reported as not checked; blocks nothing)
LACKS_LOGITS = ("full-vocabulary logits: |Δlogit| and KL (the engine gives top-k logprobs only; |Δlogprob| of the "
                "reference's token is compared instead)")
LACKS_TAPS = "per-layer bisection (the engine exposes no taps)"


@dataclass(frozen=True)
class DiffSpec:
    engine: str = DEFAULT_ENGINE
    against: str = JUDGE
    model: str = "smollm2-135m"
    prompts: str = "builtin"
    max_new_tokens: int = 32
    dtype: str = "float32"
    batch: int = 8
    fault: str | None = None
    noise_tol: float | None = None  # None: NOISE_TOL[dtype]
    require: tuple[str, ...] = ()  # claims that become verdict conditions: REQUIRABLE
    engine_options: tuple[tuple[str, str], ...] = ()  # --engine-option KEY=VALUE
    seed: int = 0  # --require batch-invariance: the batches' request order
    float32_build: bool = True  # bf16: also diff the engine built in float32 (evalsuite/compare/build.py)
    batching: bool = True  # the batching part: every prompt in one call, staggered stops (compare/batching.py)
    main_only: bool = False  # the float32 build of a bf16 diff: fixed batches only, the bf16 run drove the paths

    def __post_init__(self):
        if self.against != JUDGE:
            raise SpecError(f"--against {self.against!r}: only {JUDGE!r} (the float32 judge) is supported")
        if self.max_new_tokens < 1:
            raise SpecError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if not 1 <= self.batch <= 8:
            raise SpecError(f"--batch must be in [1, 8], got {self.batch}")
        if self.noise_tol is not None and not self.noise_tol > 0:
            raise SpecError(f"--noise-tol must be > 0, got {self.noise_tol}")
        if unknown := [r for r in self.require if r not in REQUIRABLE]:
            raise SpecError(f"--require {unknown[0]!r}: expected one of {', '.join(REQUIRABLE)}")


def run_diff(spec: DiffSpec, progress: Callable[[str], None] = lambda s: None) -> DiffResult:
    """The diff of spec; in bf16 followed by the engine's float32 build on the same prompts (build.py)."""
    result = _diff_one(spec, progress)
    if spec.dtype == "float32":
        return result
    return build.with_float32_build(spec, result, lambda s: _diff_one(s, lambda m: progress(f"float32 build: {m}")))


@dataclass
class _Run:
    """One diff's inputs and what its parts found, filled part by part."""

    spec: DiffSpec
    model: object
    pset: object
    encoded: list  # (Prompt, ids)
    skipped: list
    ref: object  # the float32 judge
    recipe: object | None  # bf16: the reference in the engine's declared recipe (or its default)
    orders: object | None  # witness.OrderSpread
    eng: object
    tol: rule.Tolerances  # then the result's two lists, named as in its JSON
    not_checked: list = field(default_factory=list)  # no PASS without it
    checks_not_possible: list = field(default_factory=list)  # said, blocks nothing
    per_prompt: list = field(default_factory=list)
    tracks: dict = field(default_factory=dict)  # prompt index -> the reference's Forced record (full logits)
    ref_tokens: dict = field(default_factory=dict)  # prompt index -> the reference's greedy tokens
    mains: dict = field(default_factory=dict)  # prompt index -> the engine's main-part Generation
    group_of: dict = field(default_factory=dict)  # prompt index -> (its main-part group, its row there)
    matched: list = field(default_factory=list)
    drift_e: dict = field(default_factory=dict)
    drift_r: dict = field(default_factory=dict)
    margins: dict = field(default_factory=dict)
    recipe_real: dict = field(default_factory=dict)
    slopes: dict = field(default_factory=dict)
    witnessed: list = field(default_factory=list)
    under16: list = field(default_factory=list)

    @property
    def caps(self):
        return self.eng.capabilities

    def eos(self) -> tuple[int, ...]:
        """The model's end-of-turn ids (the batching part's stop ids)."""
        tok = self.model.tokenizer
        return tuple(tok.eos_ids) if tok is not None else ()


def _setup(spec: DiffSpec) -> _Run:
    model = load_model(spec.model)
    pset = load_prompts(spec.prompts)
    c = model.config
    encoded, skipped = [], []
    for p in pset.prompts:
        ids = p.encode(model.tokenizer)
        if len(ids) + spec.max_new_tokens > c.max_context or any(t >= c.vocab_size for t in ids):
            skipped.append({"id": p.id, "tokens": len(ids), "why": "exceeds context or vocabulary"})
        else:
            encoded.append((p, ids))
    if not encoded:
        raise SpecError(f"no prompt of {pset.name} fits {spec.model}'s context of {c.max_context}")
    eng = make_engine(spec.engine, model, spec.dtype, spec.fault, dict(spec.engine_options))
    ref = judge(model)  # on the global mesh (evalsuite --mesh), as its bf16 recipe
    declared = eng.recipe if spec.dtype != "float32" else None
    recipe = judge(model, spec.dtype, recipe=declared) if spec.dtype != "float32" else None
    # where flags survive the judge's own error (float32: from float64; bf16: its recipe's), the same judge in other
    # reduction orders (witness.ORDER_SEEDS)
    orders = witness.OrderSpread(lambda seed: judge(model, spec.dtype, order_seed=seed, recipe=declared),
                                 model.weights.nbytes)
    run = _Run(spec, model, pset, encoded, skipped, ref, recipe, orders, eng,
               rule.Tolerances.for_dtype(spec.dtype, spec.noise_tol))
    caps = run.caps
    # what this engine cannot show is said (checks_not_possible); what blocks a PASS is listed apart (not_checked)
    run.checks_not_possible = (([LACKS_LOGITS] if not caps.logits else []) + ([LACKS_TAPS] if not caps.taps else [])
                               + list(caps.notes))
    if not caps.forced:
        run.checks_not_possible.append("teacher-forced comparison after the first divergence (" + caps.forced_refusal
                                       + "): only the free-running tokens up to it are compared")
    run.not_checked = caps.not_checked(uses_forced=caps.forced)
    if not (caps.gen_logprobs or caps.forced):
        run.not_checked.append("logprobs: the engine returns none (generated or teacher-forced), so only token "
                               "identity is compared")
    return run


def _main_part(run: _Run, progress: Callable[[str], None]) -> None:
    """Fixed batches of at most --batch prompts, N tokens each, no stop: free-running and teacher-forced."""
    spec, encoded, N = run.spec, run.encoded, run.spec.max_new_tokens
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i][1]))  # similar lengths batch well
    run.per_prompt = [None] * len(encoded)
    calls = [[order[k] for k in g] for g in groups.groups([len(encoded[i][1]) for i in order], spec.batch)]
    for bi, idx in enumerate(calls):
        progress(f"diff: batch {bi + 1}/{len(calls)} ({len(idx)} prompts, {N} tokens)")
        for r, i in enumerate(idx):
            run.group_of[i] = (idx, r)
        _main_group(run, idx)


def _main_group(run: _Run, idx: list[int]) -> None:
    caps, N, tol = run.caps, run.spec.max_new_tokens, run.tol
    routed = run.recipe is not None and run.model.config.n_moe_layers > 0
    # a float32 claim is also judged under bf16's bounds, to say what kind of difference a FAIL is
    tol16 = rule.Tolerances.for_dtype("bfloat16") if run.spec.dtype == "float32" else None
    # an engine that cannot be made to run past end-of-turn ends there; everything else decodes N tokens
    eos_ids = run.eos() if not caps.runs_past_eos else ()
    prompts = [run.encoded[i][1] for i in idx]
    rgen = run.ref.generate(prompts, N, top_k=5, want_logits=True)
    rtoks = [g.token_ids for g in rgen]
    egen = run.eng.generate(prompts, N, top_k=5)
    text_only = [text.resolve(run.model.tokenizer, rg.token_ids, eg) for rg, eg in zip(rgen, egen)]
    forced = run.eng.forced_topk(prompts, rtoks, 5, want_logits=caps.logits) if caps.forced else [None] * len(idx)
    # the bf16 recipe along the reference's tokens: the drift baseline, and on an MoE model (top-5, logits)
    # the witness of where the reference's own bf16 rounding is beyond the bounds (rule.routing_ties)
    # (full logits always: the conditioning witness of a flagged bf16 position is the recipe's own error there)
    rec = run.recipe.forced_topk(prompts, rtoks, 5 if routed else 1, want_logits=True) if run.recipe \
        else [None] * len(idx)
    for i, rg, eg, fo, rl, how in zip(idx, rgen, egen, forced, rec, text_only):
        pid = run.encoded[i][0].id
        if how == "unresolved":  # the server's text differs and its ids cannot be recovered: not judged
            run.not_checked.append(f"prompt {pid}: " + text.why_unresolved(eg))
            eg = rg  # placeholder so the record's shape holds; counted as not checked above
        track = rg.track()
        rec = rule.compare_prompt(rg.token_ids, track, fo, eg, tol, eos_ids=eos_ids)
        if rec["real_positions"] and how != "unresolved":  # the conditioning witness (rule.CONDITIONING)
            rec = witness.with_witness(run.ref, witness.Flagged(run.encoded[i][1], rg, fo, eg, rec, eos_ids, track, rl),
                                       tol, run.witnessed, run.orders)
        if tol16 is not None and how != "unresolved":  # the same positions under bf16's bounds
            r16 = rule.compare_prompt(rg.token_ids, track, fo, eg, tol16, eos_ids=eos_ids)
            run.under16.append(len(r16["real_positions"]))
        if how is not None:
            rec["compared_as"] = how
        if how == text.TEXT_NO_SPECIAL:
            run.not_checked.append(f"prompt {pid}: {text.NO_SPECIAL_NOTE}")
        if how in (text.TEXT, text.TEXT_NO_SPECIAL) and np.isnan(np.asarray(eg.top_logprobs, float)).all():
            run.not_checked.append(f"prompt {pid}: matched as text only; the server's logprobs for it do "
                                "not line up with the reference's tokens, so none were compared")
        if rl is not None and caps.logits and fo is not None:  # the bf16 logit-scale check (rule.SCALE)
            run.slopes[i] = (rule.logit_slope(rg.logits, fo.logits), rule.logit_slope(rg.logits, rl.logits))
        if rl is not None and rec.drift is not None:
            run.drift_e[i] = rec.drift
            run.drift_r[i] = (metrics.kl(rg.logits, rl.logits) if caps.logits
                              else np.abs(rl.token_logprobs - track.token_logprobs))
        if routed:
            run.margins[i] = routing.routing_margins(run.ref, run.recipe, run.encoded[i][1], rg.token_ids)
            run.recipe_real[i] = rule.compare_prompt(rg.token_ids, track, rl, None, tol)["real_positions"]
        run.tracks[i] = track
        run.ref_tokens[i] = list(rg.token_ids)
        run.mains[i] = None if how == "unresolved" else eg
        run.matched.extend(float(x) for x in rec.matched)
        _texts(run.model.tokenizer, rec["first_divergence"])
        run.per_prompt[i] = {"id": pid, "kind": run.encoded[i][0].kind, "prompt_tokens": len(rg.prompt_ids), **rec}


def _texts(tok, fdv: dict | None) -> None:
    if fdv is not None and fdv.get("engine_token") is not None and tok is not None:
        fdv |= {f"{who}_text": tok.decode([fdv[f"{who}_token"]]) for who in ("reference", "engine")}


def _batching_part(run: _Run, progress: Callable[[str], None]) -> dict:
    """The engine driven as a benchmark drives it (evalsuite/compare/batching.py)."""
    idx = list(range(len(run.encoded)))
    tok = run.model.tokenizer
    rec = batching.run(run.eng, [run.encoded[i][1] for i in idx], [run.encoded[i][0].id for i in idx],
                       [run.ref_tokens[i] for i in idx], [run.tracks[i] for i in idx],
                       [run.mains.get(i) for i in idx], run.spec.max_new_tokens, run.eos(), run.tol, tok,
                       progress, reference=run.ref, max_context=run.model.config.max_context,
                       second_look=witness.SecondLook(run.ref, run.recipe, run.orders, run.tol, run.witnessed,
                                                      routing.largest_move(run.margins)))
    for row in rec["per_prompt"]:
        _texts(tok, row.get("first_divergence"))
        if row.get("routing_note"):  # real positions at routing near-ties: not judged, so no PASS on them
            run.not_checked.append(f"batching part, prompt {row['id']}: {row['routing_note']}")
    if rec["unresolved"]:
        run.not_checked.append(f"batching part: {len(rec['unresolved'])} prompts came back as text that differs from "
                            "the reference's and cannot be turned back into token ids: not judged")
    return {"run": True, **rec}


def _diff_one(spec: DiffSpec, progress: Callable[[str], None]) -> DiffResult:
    t0 = time.time()
    run = _setup(spec)
    _main_part(run, progress)
    if spec.main_only:  # said, not blocking: the bf16 run this build belongs to drove and judged those paths
        part = {"run": False, "why": build.MAIN_ONLY}
    else:
        part = _batching_part(run, progress) if spec.batching else {
            "run": False, "why": "turned off (--no-batching): no refill, shrink, stop or split prefill was driven"}
    paths = coverage.report(run.eng)
    (run.checks_not_possible if spec.main_only else run.not_checked).extend(coverage.blocking(paths))
    if not paths["reported"]:
        sent = "; the batching part still sent them" if part.get("run") else ""
        run.checks_not_possible.append(paths["why"] + sent)
    if not spec.batching and not spec.main_only:
        run.not_checked.append(f"batching part: {part['why']}")
    own = recipe_check.check(run.eng, run.model, [(p.id, ids) for p, ids in run.encoded],
                             [run.ref_tokens[i] for i in range(len(run.encoded))], run.recipe, run.orders,
                             spec.max_new_tokens, progress) if spec.dtype != "float32" else None
    if own is not None:
        (run.not_checked if own.get("blocks") else run.checks_not_possible).extend(own.get("notes", []))
    return _verdict(run, part, paths, own, t0, progress)


def _drift_and_scale(run: _Run) -> tuple[dict, dict, dict | None]:
    """bf16's run-wide checks (drift, logit scale) and the routing near-ties; what they could not check is noted."""
    spec, caps = run.spec, run.caps
    routed = run.recipe is not None and run.model.config.n_moe_layers > 0
    ties = routing.routing_ties(run.per_prompt, run.margins, witness=run.recipe_real) if routed else None
    ns = [w["note"] for w in run.witnessed if not w["run"]]  # one a flagged prompt: each said once, counted
    run.not_checked += [n + (f" ({ns.count(n)} prompts)" if ns.count(n) > 1 else "") for n in dict.fromkeys(ns)]
    if ties and ties["positions_not_judged"]:  # replayed with the engine's routing where it reports it (replay.py)
        left = replay.judge_ties(run.ref, run.recipe, run.eng, [p for _, p in run.encoded], [run.ref_tokens[i] for i in
                                 range(len(run.encoded))], run.per_prompt, run.tol, ties, run.orders)
        run.not_checked += [left] if left else []
    # drift over every position, routing near-ties included: its bulk leaves out the positions beyond the
    # per-position bound, its tail counts them (docs/rule.md, "bf16 drift")
    drift = rule.drift_check([v for _, v in sorted(run.drift_e.items())], [v for _, v in sorted(run.drift_r.items())],
                             spec.dtype, "kl" if caps.logits else "logprob")
    if spec.dtype != "float32" and not drift["checked"]:  # blocks a PASS, so it is listed with what does
        run.not_checked.append(drift["why"])
    slopes = run.slopes
    scale = rule.scale_check([slopes[i][0] for i in sorted(slopes)], [slopes[i][1] for i in sorted(slopes)],
                             spec.dtype) if caps.logits or spec.dtype == "float32" else {
        "checked": False, "why": "bf16 logit-scale check (rule.SCALE): the engine gives no full logits, and the "
                                 "signed |Δlogprob| of one token is too noisy to stand in (measured on mini-llama); "
                                 "run the engine in-process (a plugin) or diff it in float32"}
    if spec.dtype != "float32" and not scale["checked"]:  # a PASS rests on it (what the drift check cannot see)
        run.not_checked.append(scale["why"])
    return drift, scale, ties


def _invariance(run: _Run, progress: Callable[[str], None]) -> tuple[dict, dict | None]:
    spec, encoded, N = run.spec, run.encoded, run.spec.max_new_tokens
    progress("diff: batch invariance and determinism")
    measured = invariance.batch_invariance(run.eng, [ids for _, ids in encoded[:invariance.INVARIANCE_BATCH]], N)
    strict = None
    if "batch-invariance" in spec.require:
        progress("diff: --require batch-invariance (batch sizes 1-8, seeded order)")
        strict = invariance.strict_batch_invariance(
            run.eng, [(p.id, ids) for p, ids in encoded[:invariance.STRICT_INVARIANCE_PROMPTS]], N, spec.seed)
        if strict["batch_sizes"] == [1]:
            run.not_checked.append("batch invariance: required, but only one prompt fits, so no batch could be formed")
    return measured, strict


def _verdict(run: _Run, part: dict, paths: dict, own: dict | None, t0: float,
             progress: Callable[[str], None]) -> DiffResult:
    spec, caps, per_prompt = run.spec, run.caps, run.per_prompt
    drift, scale, ties = _drift_and_scale(run)
    bisection = bisect.first_mismatch(run, part, progress)
    measured, strict = _invariance(run, progress)
    real = sum(len(r["real_positions"]) for r in per_prompt)
    batched_real = part.get("real_mismatches", 0)
    benign = sum(len(r["benign_positions"]) for r in per_prompt)
    own_checks = run.eng.self_checks()  # what the engine checked on itself (the megakernel's race detector)
    failed = real > 0 or batched_real > 0 or not measured["deterministic"] or not all(s["ok"] for s in own_checks) \
        or (drift["checked"] and not drift["ok"]) or (scale["checked"] and not scale["ok"]) \
        or (strict is not None and not strict["ok"]) or (own is not None and own.get("ok") is False)
    unchecked_drift = spec.dtype != "float32" and not drift["checked"]
    verdict = "FAIL" if failed else "INCONCLUSIVE" if unchecked_drift or run.not_checked else "PASS"
    out = {"verdict": verdict, **_figures(run, real, benign), "bf16_drift": drift, "bf16_logit_scale": scale,
           "bf16_recipe": own, "routing": None if ties is None else {k: v for k, v in ties.items() if k != "tied"},
           "conditioning_witness": witness.summary(run.witnessed, spec.dtype),
           "checks_not_possible": run.checks_not_possible, "not_checked": run.not_checked,
           "engine_capabilities": caps.report(), "batching": part, "paths": paths, "engine_stats": run.eng.run_stats(),
           "engine_self_checks": own_checks, "bisection": bisection,
           "batch_invariance": measured, "batch_invariance_required": strict, "per_prompt": per_prompt,
           "seed": None, "seed_note": "greedy decoding: no random choice is made",
           "versions": versions(), "spec": asdict(spec),
           "seconds": round(time.time() - t0, 1)}
    typed = {k: out.pop(k) for k in ("verdict", "engine", "model", "dtype", "fault", "prompts", "positions",
                                      "real_mismatches", "benign_divergences", "prompts_identical", "noise_tolerance")}
    return DiffResult(**typed, not_checked=tuple(out.pop("not_checked")),
                      checks_not_possible=tuple(out.pop("checks_not_possible")),
                      failing_prompts=tuple(r["id"] for r in per_prompt if r["real_positions"]),
                      deterministic=measured["deterministic"], seconds=out.pop("seconds"), details=out)


def _figures(run: _Run, real: int, benign: int) -> dict:
    """The main part's headline figures and the tolerances they were judged by."""
    spec, caps, per_prompt, tol = run.spec, run.caps, run.per_prompt, run.tol
    summary = {"max_dlogprob": metrics.summary(r["tf"]["max_dlogprob"] for r in per_prompt
                                               if r["tf"]["max_dlogprob"] is not None),
               "argmax_agreement": metrics.mean_of(r["tf"]["argmax_agreement"] for r in per_prompt)}
    if caps.logits and caps.forced:  # |Δlogit| and KL exist only where the engine was teacher-forced
        summary |= {"max_dlogit": metrics.summary(r["tf"]["max_dlogit"] for r in per_prompt
                                                  if r["tf"]["max_dlogit"] is not None),
                    "kl": metrics.summary(v for r in per_prompt for v in r["tf"]["kl"] or [])}
    tol16 = rule.Tolerances.for_dtype("bfloat16")
    return {
        "character": rule.character(per_prompt, real, sum(run.under16), tol16) if spec.dtype == "float32" else None,
        "engine": spec.engine, "against": spec.against, "model": spec.model,
        "weights_sha256": run.model.weights.sha256, "dtype": spec.dtype, "reference_dtype": "float32",
        "judge_placement": run.ref.placement(), "engine_placement": run.eng.placement(),
        "fault": spec.fault, "prompt_set": run.pset.name, "prompt_set_sha256": run.pset.sha256,
        "prompts": len(run.encoded), "skipped": run.skipped, "max_new_tokens": spec.max_new_tokens,
        "positions": len(run.encoded) * spec.max_new_tokens,
        "real_mismatches": real, "benign_divergences": benign,
        "real_token_mismatches": sum(len(r["token_mismatches"]) for r in per_prompt),
        "distribution_mismatches": sum(len(r["distribution_mismatches"]) for r in per_prompt),
        "tolerances": {"dlogit": tol.dlogit, "kl": tol.kl, "noise": tol.noise, "logprob": tol.logprob},
        "tolerance_overrides": tol.overrides(),
        "kl_tolerance": tol.kl if caps.logits and caps.forced else None,
        "logprob_tolerance": tol.logprob,
        "noise_tolerance": tol.noise,
        "noise_tolerance_rule": ("a divergence is benign iff the engine's token is within the noise tolerance of "
                                 "the reference's top-1 logit and the position's |Δlogit| and KL (over an API: "
                                 "|Δlogprob|) are within their tolerances (evalsuite/compare/rule.py)"),
        "prompts_identical": sum(r["first_divergence"] is None and r.get("compared_as") != "unresolved"
                                 for r in per_prompt),
        "observed_noise": metrics.summary(run.matched),
        "summary": summary,
    }
