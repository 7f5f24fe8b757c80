"""engines.weights.permuted: the same model with its hidden and MLP dimensions reordered, the bf16 witness's other
reduction orders (evalsuite/compare/witness.py)."""

from __future__ import annotations

import numpy as np
import pytest

from engines.reference import ReferenceEngine
from engines.weights import permuted

# The same math summed in another order: float32 rounding only. Measured on a 7-token prompt + 8 forced tokens:
# mini-llama 5.2e-6, mini-moe 1.6e-5 (as one ulp of one embedding entry moves them, tests/engines/test_mini.py).
SAME_MATH_TOL = 1e-4


def test_a_permuted_model_is_the_same_model_summed_in_another_order(mini_llama, mini_moe):
    seq = [1, 5, 9, 33, 70, 2, 8, 11, 200, 3, 17, 64, 99, 4, 6]
    for m in (mini_llama, mini_moe):
        a = ReferenceEngine(m.weights).score([seq])[0].logits
        for seed in (1, 2):
            b = ReferenceEngine(permuted(m.weights, seed)).score([seq])[0].logits
            d = float(np.abs(np.asarray(b) - np.asarray(a)).max())
            assert 0 < d < SAME_MATH_TOL, (m.name, seed, d)  # another order (not bitwise), the same math


def test_the_permutation_is_seeded_and_keeps_provenance(mini_moe):
    w = mini_moe.weights
    a, b, c = permuted(w, 1), permuted(w, 1), permuted(w, 2)
    assert all(np.array_equal(a.arrays[k], b.arrays[k]) for k in a.arrays)
    assert not np.array_equal(a.arrays["e_down"], c.arrays["e_down"])
    assert a.sha256 == w.sha256 and "seed 1" in a.source
    # a reordering, not a change: the same values along each permuted axis
    assert np.array_equal(np.sort(a.arrays["embed"], axis=1), np.sort(np.asarray(w.arrays["embed"]), axis=1))
    assert np.array_equal(a.arrays["router_bias"], np.asarray(w.arrays["router_bias"]))  # no D or F axis


def test_a_permuted_judge_past_the_host_bound_is_refused_in_one_line(mini_llama, monkeypatch):
    """evalsuite.plugins.judge(order_seed=...): a whole permuted float32 copy is held on the host, so past the float64
    witness's bound it is refused (the bf16 witness then leaves the flags standing and says why)."""
    import engines.reference.engine as ref_engine
    from engines.errors import ModelError
    from evalsuite.plugins import judge

    assert judge(mini_llama, "bfloat16", order_seed=1).dtype == "bfloat16"
    monkeypatch.setattr(ref_engine, "WITNESS_MAX_BYTES", 0)
    with pytest.raises(ModelError, match="permuted float32 copy of the weights would take"):
        judge(mini_llama, "bfloat16", order_seed=1)
