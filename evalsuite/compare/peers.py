"""Other projects' rules for "this engine matches the reference", written here from their documented
behaviour (no code copied), so that the detection table (benchmarks/detection.py) can say which
rule catches which fault. Each function judges one prompt and returns {"caught": bool, ...}.

Sources:
- vLLM `check_logprobs_close` (vllm-project/vllm, tests/models/utils.py): walk both generations'
  token ids; at the FIRST mismatch each side's token must be among the other side's top-N logprobs,
  then stop comparing that prompt; lengths that differ are compared over the shared prefix. No
  numeric tolerance; logprob values are never compared. Its model tests use N = 5, 32 tokens
  (tests/models/language/generation/test_common.py: NUM_LOG_PROBS = 5).
- MaxText's forward-pass logit checker (AI-Hypercomputer/maxtext,
  tests/utils/forward_pass_logit_checker.py): per teacher-forced position, KL(P_golden || Q_model)
  over the vocabulary; fails if ANY position's KL reaches --max_kl_div. The flag has no default;
  0.015 is the value its conversion docs and most model scripts pass (others range 5e-6 to 1.0).
- SGLang `check_close_model_outputs` (sgl-project/sglang, python/sglang/test/runners.py, called by
  test_generation_models.py): the top-5 logprob VALUES, rank by rank, of both sides' own greedy
  generations (32 tokens), |difference| < decode_tolerance 6e-2 at every step; prompt positions
  (prefill_tolerance 5e-2) only for prompts of <= 100 tokens; and ROUGE-L of the output strings >=
  rouge_l_tolerance 1, i.e. the texts identical.
"""

from __future__ import annotations

import numpy as np

from evalsuite.compare import metrics

VLLM_TOP_N = 5  # vLLM's NUM_LOG_PROBS in its generation model tests
MAXTEXT_MAX_KL = 0.015  # the --max_kl_div MaxText's docs and most of its model scripts pass
SGLANG_DECODE_TOL = 6e-2  # SGLang's default decode_tolerance (5e-2 in older releases)
SGLANG_PREFILL_TOL = 5e-2  # SGLang's default prefill_tolerance
SGLANG_PREFILL_MAX_TOKENS = 100  # SGLang compares prompt logprobs only for prompts this short
SGLANG_TOP_K = 5
RULES = ("vllm", "maxtext", "sglang")


def vllm_rule(ref_ids, ref_top_ids, eng_ids, eng_top_ids, n: int = VLLM_TOP_N) -> dict:
    """ref_ids, eng_ids: both sides' greedy tokens; *_top_ids [T, >=n]: each side's top ids per step."""
    for j, (a, b) in enumerate(zip(ref_ids, eng_ids)):
        if a != b:
            ok = int(a) in set(np.asarray(eng_top_ids[j])[:n].tolist()) and \
                int(b) in set(np.asarray(ref_top_ids[j])[:n].tolist())
            return {"caught": not ok, "position": j}
    return {"caught": False, "position": None}


def maxtext_rule(ref_logits: np.ndarray, eng_logits: np.ndarray | None, max_kl: float = MAXTEXT_MAX_KL) -> dict:
    """Both [T, V], the engine teacher-forced along the reference's tokens."""
    if eng_logits is None:
        return {"caught": None, "why": "needs the engine's full logits"}
    kl = metrics.kl(ref_logits, eng_logits)
    over = np.flatnonzero(kl >= max_kl)
    return {"caught": bool(over.size), "position": int(over[0]) if over.size else None, "max_kl": float(kl.max())}


def sglang_rule(ref_top_lp, eng_top_lp, ref_text: str, eng_text: str, tol: float = SGLANG_DECODE_TOL) -> dict:
    """*_top_lp [T, >=5]: each side's top-5 logprob values along its OWN generation, compared rank by
    rank; texts: the decoded generations (ROUGE-L 1 means identical). Prompt positions are not compared
    here: evalsuite's faults live in the decode path, and both engines' prefill is the same XLA math
    (the table says so)."""
    r = np.asarray(ref_top_lp, np.float64)[:, :SGLANG_TOP_K]
    e = np.asarray(eng_top_lp, np.float64)[:, :SGLANG_TOP_K]
    t = min(len(r), len(e))
    d = np.abs(r[:t] - e[:t]).max(axis=-1) if t else np.zeros(0)
    over = np.flatnonzero(d >= tol)
    texts_equal = ref_text == eng_text
    return {"caught": bool(over.size) or not texts_equal, "position": int(over[0]) if over.size else None,
            "max_dlogprob": float(d.max()) if d.size else 0.0, "texts_identical": texts_equal}
