"""The parity part of `run`: every generated answer of the engine under test against the judge's greedy track,
position by position (bench.scoring), as per-item records and a run's summary; and what the judge's work was."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from evalsuite.bench.adapter import journal_array
from evalsuite.bench.scoring import Answer, judge_item, parity
from evalsuite.compare import rule
from evalsuite.stops import cut_at_stop, visible_text

FIRST_MISSING = 5  # items without a parity record named one by one, the rest counted


def parity_records(judge_lm, eng_lm, requests: dict, records: list[dict], dtype: str,
                   progress: Callable[[str], None]) -> None:
    """The parity part's per-item record, added to each generated item of the engine's records ("parity"): its
    answer against the judge's greedy track (bench.scoring.judge_item), in the rule's tolerances for its dtype."""
    tol = rule.Tolerances.for_dtype(dtype)
    tok = judge_lm.model.tokenizer
    gen = [r for r in records if r["doc_id"] in requests]
    for n, r in enumerate(gen):
        ctx, kw = requests[r["doc_id"]]
        e, j = eng_lm.journal_record(ctx, kw), judge_lm.journal_record(ctx, kw)
        if e.get("token_ids") is None or j.get("token_ids") is None:
            r["parity"] = {"not_checked": "no token ids journaled for this answer"}
            continue
        prompt = judge_lm.request_prompt(ctx, kw)
        if e.get("prompt_counted") is not None and e["prompt_counted"] != len(prompt):
            r["parity"] = {"not_checked": f"the server read the prompt as {e['prompt_counted']} tokens where the "
                                          f"judge has {len(prompt)}: its answer is not comparable token for token"}
            continue
        if not e.get("ids_exact", True):  # a text-only server's ids are not its own: its answer compared as text
            until = judge_lm.gen_request(ctx, kw)[0]
            theirs = cut_at_stop(visible_text(tok, j["token_ids"]), until)[0]
            r["parity"] = ({"compared_as": "text", "positions": 0, "real_positions": [], "token_mismatches": [],
                            "distribution_mismatches": [], "benign_positions": [], "first_divergence": None,
                            "max_dlogprob": None, "witness": None,
                            "note": "the server's ids are not its own; its answer equals the judge's as text"}
                           if e.get("result") == theirs else
                           {"not_checked": "the server returned text whose ids could not be recovered exactly, and "
                                           "it differs from the judge's answer"})
            continue
        a = Answer(prompt, e["token_ids"], e["finish_reason"], journal_array(e["top_ids"], np.int64),
                   journal_array(e["top_logprobs"], np.float64))
        rg = Answer(prompt, j["token_ids"], j["finish_reason"], journal_array(j["top_ids"], np.int64),
                    journal_array(j["top_logprobs"], np.float64)).generation()
        until = judge_lm.gen_request(ctx, kw)[0]
        witnessed: list = []
        rec = judge_item(judge_lm.engine, a, rg, tol, witnessed,
                         visible=lambda ids, until=until: cut_at_stop(visible_text(tok, ids), until)[0])
        r["parity"] = {"positions": len(e["token_ids"]), "real_positions": rec["real_positions"],
                       "token_mismatches": rec["token_mismatches"],
                       "distribution_mismatches": rec["distribution_mismatches"],
                       "benign_positions": rec["benign_positions"], "first_divergence": rec["first_divergence"],
                       "max_dlogprob": rec["tf"]["max_dlogprob"], "witness": witnessed[0] if witnessed else None,
                       **({"note": rec["note"]} if "note" in rec else {})}
        if (n + 1) % 50 == 0 or n + 1 == len(gen):
            progress(f"parity: {n + 1}/{len(gen)} answers compared")


def parity_summary(records: list[dict], declared: dict, dtype: str) -> dict:
    """The parity part over the engine's per-item records (parity_records), for run and merge alike."""
    gen = [r for r in records if r.get("generated_tokens") is not None]
    if not gen:
        return {"run": False, "judged": False, "why": "loglikelihood variant: every item is scored, none generated; "
                "the engine's forced path enters the verdict through its loglikelihoods (token parity: evalsuite diff)"}
    items = [{"doc_id": r["doc_id"], "record": r["parity"], "positions": r["parity"]["positions"]}
             for r in gen if r.get("parity") and "not_checked" not in r["parity"]]
    missing = [f"item {r['doc_id']}: {(r.get('parity') or {}).get('not_checked', 'no parity record')}"
               for r in gen if not r.get("parity") or "not_checked" in r["parity"]]
    witnessed = [r["parity"]["witness"] for r in gen if r.get("parity") and r["parity"].get("witness")]
    if items and all(it["record"].get("max_dlogprob") is None for it in items):
        missing.insert(0, "logprobs: the engine reported none with its answers, so only token identity was compared")
    out = parity(items, bool(declared.get("judged")), declared.get("why_not"),
                 rule.Tolerances.for_dtype(dtype), witnessed, missing[:FIRST_MISSING] + (
                     [f"... and {len(missing) - FIRST_MISSING} more items"] if len(missing) > FIRST_MISSING else []))
    return {"run": True, **out}


def judge_work(judge: list[dict], engine: list[dict]) -> dict:
    """Tokens the engine generated against the tokens the judge scored and decoded itself (scoring mode)."""
    gen = sum(r.get("generated_tokens") or 0 for r in engine)
    scored = [r for r in judge if "scored_tokens" in r]
    if not scored:
        decoded = sum(r.get("generated_tokens") or 0 for r in judge)
        return {"mode": "decodes" if decoded else "n/a (loglikelihood)", "engine_generated": gen,
                "judge_decoded": decoded}
    decoded = sum(r["decoded_tokens"] for r in scored)
    why: dict[str, int] = {}
    for r in scored:
        why[r["scoring"]] = why.get(r["scoring"], 0) + 1
    return {"mode": "scores", "engine_generated": gen, "judge_scored": sum(r["scored_tokens"] for r in scored),
            "judge_decoded": decoded, "decoded_share": decoded / gen if gen else None,
            "items_decoded": sum(r["decoded_from"] is not None for r in scored), "items_by_outcome": why,
            "near_ties_decided_by_a_decode_step": sum(r.get("near_ties", 0) for r in scored)}
