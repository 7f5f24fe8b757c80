"""Incremental decode through the KV cache equals a full-sequence forward (teacher forcing)."""

from __future__ import annotations

import numpy as np
import pytest

from engines.reference import ReferenceEngine

# Relative error = max |logit_incremental - logit_full| / max |logit_full|. The two paths sum the
# same products in different orders (prefill matmuls over T rows vs one row per step).
# Measured max: 4.2e-7 (mini-llama), 2.6e-7 (mini-moe), 3.0e-6 (smollm2-135m); the bound is the
# issue's 1e-5, 3x above the worst seen.
DECODE_REL_TOL = 1e-5


def _sequences(vocab: int, lengths: list[int], seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, vocab, size=n).tolist() for n in lengths]


@pytest.mark.parametrize("batch_lengths", [[19], [8, 23, 12]], ids=["batch1", "batch3"])
@pytest.mark.parametrize("model_name", ["mini-llama", "mini-moe",
                                        pytest.param("smollm2-135m", marks=pytest.mark.slow)])
def test_incremental_equals_full_forward(model_name, batch_lengths, request):
    from evalsuite.models import load_model

    m = load_model(model_name)
    eng = ReferenceEngine(m.weights) if model_name != "smollm2-135m" else request.getfixturevalue(
        "smollm2_ref")
    seqs = _sequences(m.config.vocab_size, batch_lengths, seed=len(batch_lengths))
    n_forced = 6  # the last 6 tokens of each sequence are fed one by one
    prompts = [s[:-n_forced] for s in seqs]
    conts = [s[-n_forced:] for s in seqs]
    incremental = eng.decode_forced(prompts, conts)
    full = eng.score(seqs)
    for s, inc, f in zip(seqs, incremental, full):
        ref = f.logits[len(s) - n_forced - 1: len(s) - 1]  # rows predicting the forced tokens
        rel = np.abs(inc - ref).max() / np.abs(ref).max()
        print(f"{model_name} len={len(s)} rel={rel:.2e}")
        assert rel <= DECODE_REL_TOL
        assert (inc.argmax(-1) == ref.argmax(-1)).all()


def test_batched_generation_equals_single_rows(mini_llama):
    """Rows of different prompt lengths in one batch get exactly what each gets alone."""
    eng = ReferenceEngine(mini_llama.weights)
    prompts = _sequences(mini_llama.config.vocab_size, [4, 17, 9], seed=7)
    together = eng.generate(prompts, 12)
    for p, g in zip(prompts, together):
        alone = eng.generate([p], 12)[0]
        assert g.token_ids == alone.token_ids
        np.testing.assert_allclose(g.top_logprobs, alone.top_logprobs, atol=1e-5)


def test_stop_ids_end_generation(mini_llama):
    eng = ReferenceEngine(mini_llama.weights)
    p = _sequences(mini_llama.config.vocab_size, [8], seed=3)
    free = eng.generate(p, 10)[0]
    stop_at = free.token_ids[3]
    first = free.token_ids.index(stop_at)
    g = eng.generate(p, 10, stop_ids=[stop_at])[0]
    assert g.token_ids == free.token_ids[:first + 1] and g.finish_reason == "stop"
    assert free.finish_reason == "length" and len(free.token_ids) == 10


# bfloat16 reference (bf16 weights and activations, f32 norms/softmax/accumulation) vs float32 on
# the mini models: measured max |Δlogit| 0.18 (mini-llama); mini-moe can flip a near-tied
# expert, so only mini-llama is bounded here.
BF16_REF_TOL = 0.5


def test_bfloat16_reference_close_to_float32(mini_llama, mini_moe):
    seqs = _sequences(320, [12, 20], seed=11)
    for m in (mini_llama, mini_moe):
        f32 = ReferenceEngine(m.weights).score(seqs)
        b16 = ReferenceEngine(m.weights, "bfloat16").score(seqs)
        for a, b in zip(f32, b16):
            assert np.isfinite(b.logits).all()
            if m.name == "mini-llama":
                assert np.abs(a.logits - b.logits).max() <= BF16_REF_TOL
