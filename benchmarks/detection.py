"""The detection table (issue 14): which rule catches which megakernel fault, and with how many prompts.

    .venv/bin/python -m benchmarks.detection --dtype float32 --out benchmarks/results/detection-float32.json
    .venv/bin/nox -s detection          # both dtypes, smollm2-135m (mini-moe for the MoE faults)

A benchmark, not a test: it prints figures and writes JSON + a Markdown table; it asserts nothing.
Prompts: benchmarks/make_prompts.py's seeded set (1,000 prompts, seed 0) in a seeded order (--seed),
the first --prompts of them that fit the model, in chunks of 8 (the megakernel's batch). For every
fault (and the faithful engine, the false-alarm row) the chunks run in that order until every rule
has caught the fault or the prompts run out; "first caught" is the 1-based count of prompts taken
when a rule first fires (within a chunk, the prompt's own index).

Rules (evalsuite/compare/rule.py and evalsuite/compare/peers.py):
- evalsuite: `diff`'s verdict on the prompts so far (any real position by the one comparator, flags
  judged again by the conditioning witness; in bfloat16 also the drift check against the reference's
  own bf16 recipe, from 256 positions, and the logit-scale check, from 8 prompts); at 8, 16, 32 and 64
  prompts also diff's batching part over those prompts (every prompt in one call, staggered stops), and in
  bfloat16 at 8 its recipe check (the engine's layers against the reference in its declared recipe); its
  batch-invariance and determinism checks are not part of this count. (The committed tables' peer columns
  predate the witnesses and the logit-scale check; their evalsuite columns were re-run under them with
  --recheck-evalsuite, the old catch kept in each row's evalsuite_recheck.)
- vllm, maxtext, sglang: as documented in peers.py. evalsuite judges a bf16 engine against the
  float32 reference (its design); the peers, as their own tests do, against a reference in the same
  dtype (here the reference's bf16 recipe).
- accuracy (lm-eval style): not computed here (docs/faults.md, "What accuracy alone catches": `evalsuite run --fault`).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.detection_tables import RULES, float32_catches, merge, table
from benchmarks.make_prompts import make
from engines import compile_cache
from engines.megakernel import MegakernelEngine
from engines.megakernel.faults import CATALOGUE, MODEL_NEEDS
from engines.reference import ReferenceEngine
from evalsuite.compare import batching, peers, recipe_check, rule
from evalsuite.compare.replay import replay_all
from evalsuite.compare.routing import routing_margins, routing_ties
from evalsuite.compare.witness import Flagged, OrderSpread, SecondLook, with_witness
from evalsuite.models import load_model
from evalsuite.plugins import judge as judge_engine
from evalsuite.prompts import Prompt
from evalsuite.versions import commit, versions

CHUNK = 8
BATCHING_AT = (8, 16, 32, 64)  # prompt counts at which diff's batching part runs over the prompts so far
RECIPE_AT = 8  # bf16: the prompt count at which diff's recipe check runs


def prompt_order(tok, n: int, seed: int, max_context: int, max_new: int) -> list[tuple[str, list[int]]]:
    rows = make(1000, 0)
    random.Random(seed).shuffle(rows)
    out = []
    for r in rows:
        ids = Prompt(r["id"], r["kind"], text=r["text"], tokens=r.get("tokens")).encode(tok)
        if len(ids) + max_new <= max_context:
            out.append((r["id"], ids))
        if len(out) == n:
            break
    return out


class Judge:
    """The reference's records, computed once per chunk of prompts (when a fault first needs it) and shared by
    every fault. On an MoE model every chunk is computed at once: diff's routing near-ties take the largest
    rounding move over the whole prompt set."""

    def __init__(self, model, dtype: str, prompts, N: int, progress):
        self.model, self.dtype, self.N, self.prompts, self.progress = model, dtype, N, prompts, progress
        self.engine = ReferenceEngine(model.weights, "float32")  # also the float32 conditioning witness
        # bf16: the reference in the faithful megakernel's declared recipe, as diff builds its judge (the drift and
        # scale baseline, the witness, the routing margins, the peers' same-dtype reference); a default recipe here
        # rounds an MoE router the engine keeps in float32, and once put a faithful engine's drift at 1.84x
        self.declared = MegakernelEngine(model.weights, dtype).recipe if dtype != "float32" else None
        self._same = ReferenceEngine(model.weights, dtype, recipe=self.declared) if dtype != "float32" else None
        self.ref, self.same, self.recipe, self.margins, self.recipe_real = [], [], [], [], []
        self.moe = self._same is not None and bool(model.config.n_moe_layers)
        self.moved = None
        if self.moe:
            self.ensure(len(prompts))
            self.moved = max((float(np.max(mv)) for _, mv in self.margins if len(mv)), default=None)

    def recipe_for(self, eng):
        """The reference in eng's declared bf16 recipe: the run's (the declared one) or own_recipe's."""
        return self.own_recipe(eng) if eng.recipe != self.declared else self._same

    def own_recipe(self, eng):
        """The reference in eng's declared bf16 recipe (diff's judge for its recipe check), built once."""
        if getattr(self, "_own", None) is None:
            self._own = ReferenceEngine(self.model.weights, self.dtype, recipe=eng.recipe)
        return self._own

    def ensure(self, upto: int) -> None:
        """Records for the first `upto` prompts."""
        ref, same, N = self.engine, self._same, self.N
        tol = rule.Tolerances.for_dtype(self.dtype)  # as diff: where the recipe itself is beyond the bounds
        for c in range(len(self.ref), min(upto, len(self.prompts)), CHUNK):
            ps = self.prompts[c:c + CHUNK]
            ids = [p for _, p in ps]
            self.progress(f"reference: prompts {c + 1}-{c + len(ids)}")
            g = ref.generate(ids, N, top_k=5, want_logits=True)
            self.ref += g
            if same is None:  # float32: the peers' judge is the reference itself
                self.same += g
                continue
            self.same += same.generate(ids, N, top_k=5, want_logits=True)  # the peers' judge, the drift baseline
            recipe = same.forced_topk(ids, [x.token_ids for x in g], 5, want_logits=True)
            self.recipe += recipe
            if self.moe:  # the reference's routing margins (float32, bf16 recipe) for diff's routing near-ties
                self.margins += [routing_margins(ref, same, p, x.token_ids) for p, x in zip(ids, g)]
                self.recipe_real += [rule.compare_prompt(x.token_ids, x.track(), r, None, tol)["real_positions"]
                                     for x, r in zip(g, recipe)]


def judge_fault(judge: Judge, prompts, fault: str | None, model, progress, only_evalsuite: bool = False) -> dict:
    """only_evalsuite: stop at evalsuite's first catch and skip the peers' rules (--recheck-evalsuite)."""
    dtype, N = judge.dtype, judge.N
    tol = rule.Tolerances.for_dtype(dtype)
    eng = MegakernelEngine(model.weights, dtype, fault=fault)
    first: dict[str, int | None] = {r: None for r in RULES}
    drift_e, drift_r, slopes, witnessed = [], [], [], []
    # as diff: the judge in other reduction orders where flags survive its own error
    orders = OrderSpread(lambda seed: judge_engine(model, dtype, order_seed=seed, recipe=eng.recipe),
                         model.weights.nbytes)
    detail = {"max_kl": 0.0, "max_sglang_dlogprob": 0.0, "real_positions": 0, "flagged": {}}
    t0, taken = time.time(), 0
    for c in range(0, len(prompts), CHUNK):
        if fault is not None and (first["evalsuite"] is not None if only_evalsuite
                                  else all(v is not None for v in first.values())):
            break
        ids = [p for _, p in prompts[c:c + CHUNK]]
        if compile_cache.relieve_maps():  # a deep model's many shapes would exhaust the process's memory maps
            progress("memory maps past half of vm.max_map_count: jax's in-memory programs dropped")
        judge.ensure(c + len(ids))
        progress(f"{fault or 'faithful'} {dtype}: prompts {c + 1}-{c + len(ids)}")
        egen = eng.generate(ids, N, top_k=5)
        forced = eng.forced_topk(ids, [judge.ref[c + i].token_ids for i in range(len(ids))], 5, want_logits=True)
        # the peers' judge is the reference in the engine's dtype: the engine teacher-forced along its tokens
        forced_same = forced if dtype == "float32" or only_evalsuite else eng.forced_topk(
            ids, [judge.same[c + i].token_ids for i in range(len(ids))], 5, want_logits=True)
        recipe = judge.recipe[c:c + len(ids)]
        if dtype != "float32" and eng.recipe != judge.declared:  # a fault that builds another form: as diff, the
            recipe = judge.own_recipe(eng).forced_topk(  # recipe it declares
                ids, [judge.ref[c + i].token_ids for i in range(len(ids))], 5, want_logits=True)
        for i, (eg, fo, fs) in enumerate(zip(egen, forced, forced_same)):
            n = c + i + 1
            rg, sg = judge.ref[c + i], judge.same[c + i]
            rec = rule.compare_prompt(rg.token_ids, rg.track(), fo, eg, tol)
            if rec["real_positions"]:  # as diff: the conditioning witness (float64 in float32, the recipe in bf16)
                rec = with_witness(judge.engine, Flagged(prompts[c + i][1], rg, fo, eg, rec, recipe=recipe[i]
                                                         if dtype != "float32" else None), tol, witnessed, orders)
            if judge.margins:  # as diff: real positions at the reference's routing near-ties are not judged
                rt = routing_ties([rec], {0: judge.margins[c + i]}, judge.moved, {0: judge.recipe_real[c + i]})
                if rt["positions_not_judged"]:  # as diff: replayed with the engine's own expert choice
                    replay_all(judge.engine, judge.recipe_for(eng), eng, [(prompts[c + i][1], rg.token_ids, rec)],
                               tol, rt["bound"], orders)
                    rp = rec.get("routing_replay") or {}
                    detail["routing_replay_real"] = detail.get("routing_replay_real", 0) + len(rp.get("real", ()))
                done = rec.get("routing_replay") or {}  # judged by the replay: cleared or real again
                left = rt["positions_not_judged"] - len(done.get("cleared", ())) - len(done.get("real", ()))
                detail["routing_not_judged"] = detail.get("routing_not_judged", 0) + left
            detail["real_positions"] += len(rec["real_positions"])
            if fault is None and rec["real_positions"]:  # a false alarm: which prompt, which positions
                detail["flagged"][prompts[c + i][0]] = rec["real_positions"]
            if dtype != "float32":
                drift_e.append(rec.drift)  # as diff: every position, routing near-ties included
                drift_r.append(rule.metrics.kl(rg.logits, recipe[i].logits))
                slopes.append((rule.logit_slope(rg.logits, fo.logits),  # as diff: the logit-scale check
                               rule.logit_slope(rg.logits, recipe[i].logits)))
            hits = {"evalsuite": bool(rec["real_positions"])}
            if not only_evalsuite:
                hits["vllm"] = peers.vllm_rule(sg.token_ids, np.asarray(sg.top_ids), eg.token_ids,
                                               np.asarray(eg.top_ids))["caught"]
                mx = peers.maxtext_rule(sg.logits, fs.logits)
                sl = peers.sglang_rule(sg.top_logprobs, eg.top_logprobs, model.tokenizer.decode(sg.token_ids),
                                       model.tokenizer.decode(eg.token_ids))
                hits |= {"maxtext": mx["caught"], "sglang": sl["caught"]}
                detail["max_kl"] = max(detail["max_kl"], mx["max_kl"])
                detail["max_sglang_dlogprob"] = max(detail["max_sglang_dlogprob"], sl["max_dlogprob"])
            for r, hit in hits.items():
                if hit and first[r] is None:
                    first[r] = n
        taken = c + len(ids)
        if first["evalsuite"] is None:
            first["evalsuite"] = _diff_parts(judge, eng, prompts, taken, orders, detail, progress, witnessed)
        if dtype != "float32" and first["evalsuite"] is None:
            d = rule.drift_check(drift_e, drift_r, dtype)
            sc = rule.scale_check([u for u, _ in slopes], [v for _, v in slopes], dtype)
            if (d["checked"] and not d["ok"]) or (sc["checked"] and not sc["ok"]):
                first["evalsuite"] = taken
            detail["drift_ratio"] = d.get("ratio")  # the bulk's; the tail's counts beside it
            tail = d.get("tail") or {}
            detail["drift_tail"] = {k: tail[k] for k in ("engine_only", "recipe_only", "p")} if tail else None
            detail["logit_scale_t"] = sc.get("t")
    if witnessed:
        detail["witness_cleared"] = sum(w.get("cleared", 0) for w in witnessed)
        detail["routing_flip_cleared"] = sum(w.get("routing_flip", 0) for w in witnessed)  # of them (compare/flip.py)
    return {"fault": fault, "dtype": dtype, "model": model.name, "first_caught": first, "prompts_taken": taken,
            "seconds": round(time.time() - t0, 1), **detail}


def _diff_parts(judge: Judge, eng, prompts, taken: int, orders, detail: dict, progress,
                witnessed: list) -> int | None:
    """diff's batching part over the first `taken` prompts (at BATCHING_AT) and, in bf16, its recipe check (at
    RECIPE_AT), as diff runs them: `taken` when either FAILs. As in diff, a prompt the batching part flags is judged
    again by the conditioning witness (witness.SecondLook)."""
    N, model, hit = judge.N, judge.model, False
    if taken in BATCHING_AT:
        compile_cache.relieve_maps()  # the part compiles many shapes of its own (batch, window and prefill buckets)
        tol = rule.Tolerances.for_dtype(judge.dtype)
        part = batching.run(eng, [p for _, p in prompts[:taken]], [i for i, _ in prompts[:taken]],
                            [g.token_ids for g in judge.ref[:taken]], [g.track() for g in judge.ref[:taken]],
                            [None] * taken, N, model.tokenizer.eos_ids, tol, progress=progress,
                            reference=judge.engine, max_context=model.config.max_context,
                            second_look=SecondLook(judge.engine, judge.own_recipe(eng) if judge.dtype != "float32"
                                                   else None, orders, tol, witnessed, judge.moved))
        detail.setdefault("batching", {})[taken] = part["real_mismatches"]
        flagged = {r["id"]: r["real_positions"] for r in part["per_prompt"] if r["real_positions"]}
        if flagged:
            detail.setdefault("batching_flagged", {})[taken] = flagged
        hit = part["real_mismatches"] > 0
    if judge.dtype != "float32" and taken == RECIPE_AT and not hit:
        own = recipe_check.check(eng, model, prompts[:taken], [g.token_ids for g in judge.ref[:taken]],
                                 judge.own_recipe(eng), orders, N, progress)
        detail["recipe_check"] = {k: own.get(k) for k in ("checked", "ok", "first_over")}
        hit = own.get("ok") is False
    return taken if hit else None


def recheck(doc: dict, out: Path, names: list[str], a, progress) -> int:
    """Re-run evalsuite's column of a committed table under today's rule: in float32 the rows it caught (a "-"
    cannot turn into a catch there: the witness only clears flags); in bfloat16 every fault's row, since the drift
    and logit-scale checks can add a catch. The faithful rows' false alarms are the 1,000-prompt runs' job. Each row
    keeps its old catch under "evalsuite_recheck" beside the new one."""
    at = commit(Path(__file__).resolve().parent)
    todo = [r for r in doc["rows"] if r["fault"] in names and "evalsuite_recheck" not in r  # a killed one resumes
            and (r["first_caught"]["evalsuite"] is not None or a.dtype != "float32")]
    t0 = time.time()
    for model_name in (a.model, a.moe_model):
        group = [r for r in todo if r["model"] == model_name]
        if not group:
            continue
        progress(f"{model_name}: {', '.join(f or 'faithful' for f in group)}")
        model = load_model(model_name)
        ps = prompt_order(model.tokenizer, a.prompts, a.seed, model.config.max_context, a.max_new_tokens)
        judge = Judge(model, a.dtype, ps, a.max_new_tokens, progress)
        for r in group:
            new = judge_fault(judge, ps, r["fault"], model, progress, only_evalsuite=True)
            before = r["first_caught"]["evalsuite"]
            r["first_caught"]["evalsuite"] = new["first_caught"]["evalsuite"]
            r["evalsuite_recheck"] = {"before": before, "commit": at, "versions": versions(),
                                      **{k: new[k] for k in ("prompts_taken", "seconds", "real_positions",
                                                             "witness_cleared", "drift_ratio", "drift_tail",
                                                             "logit_scale_t")
                                         if k in new}}
            progress(f"{r['fault']}: evalsuite {before} -> {new['first_caught']['evalsuite']} ({new['seconds']} s)")
            out.write_text(json.dumps(doc, indent=1))  # after every fault: a kill loses one row at most
    print(table(doc["rows"]))
    print(f"\n{out}: {len(todo)} rows re-checked, {time.time() - t0:.0f} s")
    return 0


# A family's own faults (engines.megakernel.faults.MODEL_NEEDS) run on a mini of that family
FAMILY_MODELS = {"sliding": "mini-gemma2", "softcap": "mini-gemma2", "sinks": "mini-gptoss", "mxfp4": "mini-gptoss",
                 "recurrent": "mini-qwen-hybrid", "low_norm": "mini-qwen-lownorm", "kda": "mini-kimi-linear",
                 "mla": "mini-kimi-linear", "mla_absorbed": "mini-kimi-linear", "router_bias": "mini-kimi",
                 "latent": "mini-kimi", "attn_res": "mini-kimi", "nope": "mini-muse"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="which rule catches which fault, and with how many prompts")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--moe-model", default="mini-moe", help="model for the MoE-only faults")
    ap.add_argument("--family-model", action="append", default=[], metavar="NEEDS=MODEL",
                    help="model for a family's own faults (sliding, softcap, sinks); defaults: "
                         + ", ".join(f"{k}={v}" for k, v in FAMILY_MODELS.items()))
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--faults", default="all", help="comma-separated names, or all")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0, help="the prompts' order")
    ap.add_argument("--out", required=True)
    ap.add_argument("--part", default="all", choices=("all", "faithful", "faults"),
                    help="which rows of each model: the faithful engine's (false alarms), the faults', or both; "
                         "split a table over processes run at once, then --merge their files")
    ap.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                    help="write --out from these tables' rows (same settings; a row repeated is an error unless "
                         "--replace) and stop")
    ap.add_argument("--replace", action="store_true",
                    help="with --merge: a later table's row replaces an earlier one of the same model and fault "
                         "(a row re-run under a changed judge)")
    ap.add_argument("--resume", action="store_true",
                    help="keep the rows already in --out (same settings) and run only the missing faults")
    ap.add_argument("--table-only", action="store_true", help="print the Markdown table of --out and stop")
    ap.add_argument("--float32-table", default=None,
                    help="with --table-only on a bfloat16 table: the float32 table of the same prompts, for the "
                         "'evalsuite + float32 build' column (what a bf16 `diff` reports)")
    ap.add_argument("--recheck-evalsuite", action="store_true",
                    help="re-run only evalsuite's column of --out under today's rule (its witnesses, drift and scale "
                         "checks), for the faults it caught (in bfloat16 all faults); each stops at evalsuite's "
                         "catch. The peers' columns are kept: their rules are unchanged")
    a = ap.parse_args(argv)
    if a.recheck_evalsuite and (a.resume or a.table_only):
        print("error: --recheck-evalsuite goes alone (not with --resume or --table-only)", file=sys.stderr)
        return 2
    if a.merge:
        return merge(a.merge, Path(a.out), a.replace)
    if a.table_only:
        if not Path(a.out).is_file() or (a.float32_table and not Path(a.float32_table).is_file()):
            print(f"error: {a.out if not Path(a.out).is_file() else a.float32_table} does not exist", file=sys.stderr)
            return 2
        doc = json.loads(Path(a.out).read_text())
        try:
            build32 = float32_catches(doc, a.float32_table) if a.float32_table else None
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(table(doc["rows"], build32))
        return 0
    names = [f.name for f in CATALOGUE] if a.faults == "all" else a.faults.split(",")
    unknown = [n for n in names if n not in {f.name for f in CATALOGUE}]
    if unknown:
        print(f"error: unknown fault(s) {', '.join(unknown)}", file=sys.stderr)
        return 2
    needs = {f.name: f.needs for f in CATALOGUE}
    progress = lambda s: print(f"[{time.strftime('%H:%M:%S')}] {s}", file=sys.stderr, flush=True)  # noqa: E731
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    if a.recheck_evalsuite and not out.is_file():
        print(f"error: --recheck-evalsuite: {out} does not exist (run the table first)", file=sys.stderr)
        return 2
    if (a.resume or a.recheck_evalsuite) and out.is_file():
        try:
            old = json.loads(out.read_text())
            if not isinstance(old, dict) or not isinstance(old.get("rows"), list):
                raise ValueError("no rows")
        except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
            print(f"error: {out} is not a detection table ({e})", file=sys.stderr)
            return 2
        same = (old.get("prompts"), old.get("order_seed"), old.get("max_new_tokens"), old.get("dtype"))
        if same != (a.prompts, a.seed, a.max_new_tokens, a.dtype):
            print(f"error: {out} was written with other settings {same}", file=sys.stderr)
            return 2
        rows = old["rows"]
    if a.recheck_evalsuite:
        return recheck(old, out, names, a, progress)
    done = {(r["model"], r["fault"]) for r in rows}
    t0 = time.time()
    family = {**FAMILY_MODELS, **dict(kv.split("=", 1) for kv in a.family_model if "=" in kv)}
    groups = [(a.model, [n for n in names if needs[n] not in MODEL_NEEDS]),
              (a.moe_model, [n for n in names if needs[n] == "moe"])]
    for m in dict.fromkeys(family.values()):  # each family mini once, with the faults of its layers
        groups.append((m, [n for n in names if family.get(needs[n]) == m]))
    for model_name, faults in groups:
        if not faults:  # a model's faithful row runs only beside faults chosen on it
            continue
        group = ([] if a.part == "faults" else [None]) + ([] if a.part == "faithful" else faults)
        group = [f for f in group if (model_name, f) not in done]
        if not group or (a.part == "all" and group == [None]):
            continue
        progress(f"{model_name}: {', '.join(f or 'faithful' for f in group)}")
        model = load_model(model_name)
        ps = prompt_order(model.tokenizer, a.prompts, a.seed, model.config.max_context, a.max_new_tokens)
        judge = Judge(model, a.dtype, ps, a.max_new_tokens, progress)
        for f in group:
            rows.append(judge_fault(judge, ps, f, model, progress))
            r = rows[-1]
            progress(f"{f}: {r['first_caught']} ({r['seconds']} s)")
            result = {"rows": rows, "prompts": a.prompts, "prompt_set": "benchmarks/make_prompts.py n=1000 seed=0",
                      "order_seed": a.seed, "max_new_tokens": a.max_new_tokens, "dtype": a.dtype,
                      "thresholds": {"maxtext_max_kl": peers.MAXTEXT_MAX_KL, "sglang_decode": peers.SGLANG_DECODE_TOL,
                                     "vllm_top_n": peers.VLLM_TOP_N},
                      "versions": versions(), "seconds": round(time.time() - t0, 1)}
            out.write_text(json.dumps(result, indent=1))  # after every fault: a kill loses one row at most
    print(table(rows))
    print(f"\n{out}: {len(rows)} rows, {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
