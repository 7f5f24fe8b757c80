"""The megakernel's verify step (engines.megakernel.verify): T tokens a row in ONE kernel call give what T decode
steps give, its state snapshots are the states between those steps, its DMA schedule has no race, and the block-mask
fault moves exactly the rows it should."""

from __future__ import annotations

import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from engines.megakernel import MegakernelEngine, verify
from engines.megakernel.engine import races_found
from engines.spec.target import _padded
from evalsuite.models import load_model

T, SLOTS, K = 4, 128, 3
# The verify step's top-k logprobs against T decode steps', float32, 2 rows x 4 tokens: measured 1.2e-6 (mini-llama,
# mini-qwen-hybrid), 9.5e-7 (mini-gemma2), 1.1e-5 (mini-gptoss); the same math with the block's rows picked by
# one-hot matmuls and batched into other shapes, and nothing more, so a bound above the largest
SAME = 3e-5


def _state(eng, prompts):
    """The prompts prefilled into rows 0.. of one batch state (the engine's own prefill and refill)."""
    steps, state = eng.steps(), None
    for r, p in enumerate(prompts):
        *_, row = steps.prefill(_padded(p), np.array([len(p)], np.int32), SLOTS, K, False)
        state = steps.insert(state, row, np.array([r], np.int32), np.array([0], np.int32), len(prompts), SLOTS)
    return state


def _block(m, eng, n_rows: int = 2, seed: int = 5):
    """Prompts of different lengths, and their greedy continuations' first T tokens as the block (anchor + drafts
    the target agrees with)."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(3, m.config.vocab_size, size=n).tolist() for n in (9, 14, 5, 11)[:n_rows]]
    gens = eng.generate(prompts, T + 1, top_k=K)
    tokens = np.array([g.token_ids[:T] for g in gens], np.int32)
    positions = np.array([[len(p) + t for t in range(T)] for p in prompts], np.int32)
    return prompts, gens, tokens, positions


@pytest.mark.parametrize("name", [pytest.param("mini-llama", marks=pytest.mark.heavy), "mini-qwen-hybrid"])
def test_one_call_equals_t_decode_steps_and_snapshots_are_the_states_between(name):
    m = load_model(name)
    eng = MegakernelEngine(m.weights)
    prompts, gens, tokens, positions = _block(m, eng)
    v = verify.step(eng, tokens, positions, _state(eng, prompts), K, False)
    for b, g in enumerate(gens):  # row t predicts the token after block token t: the decode stream's t+1
        assert v.argmax[b].tolist() == g.token_ids[1:T + 1]
        np.testing.assert_allclose(v.top_logprobs[b], g.top_logprobs[1:T + 1], atol=SAME)
    state, steps = _state(eng, prompts), eng.steps()
    for t in range(T):  # the decode steps' state after token t is the snapshot t
        *_, state = steps.decode(tokens[:, t], positions[:, t], state, K, False)
        for snap, a in zip(v.snapshots, state[2:]):
            np.testing.assert_allclose(np.asarray(snap[:, t]), np.asarray(a), atol=SAME)
    assert bool(v.snapshots) == (name == "mini-qwen-hybrid")
    kept = np.array([2, 4])  # a rollback: row 0 keeps 2 block tokens, row 1 all 4
    back = verify.restored(v.state, v.snapshots, kept)
    for snap, a in zip(v.snapshots, back[2:]):
        np.testing.assert_array_equal(np.asarray(a[:, 0]), np.asarray(snap[:, 1, 0]))
        np.testing.assert_array_equal(np.asarray(a[:, 1]), np.asarray(snap[:, 3, 1]))


def test_block_mask_fault_moves_the_block_and_is_nothing_in_a_decode_step():
    """Off by one, a row sees the next block token: every row moves (row 0 most directly, the later rows through the
    layers after the first); in a decode step (a block of one) there is no next token, and the faulted kernel gives
    the faithful one's numbers bit for bit: the fault is the block mask and nothing else."""
    m = load_model("mini-llama")
    good, bad = MegakernelEngine(m.weights), MegakernelEngine(m.weights, verify_fault="block_mask_ahead")
    prompts, _, tokens, positions = _block(m, good)
    a = verify.step(good, tokens, positions, _state(good, prompts), K, False)
    b = verify.step(bad, tokens, positions, _state(bad, prompts), K, False)
    moved = np.abs(a.top_logprobs[:, :, 0] - b.top_logprobs[:, :, 0])
    assert (moved[:, 0] > 1e-3).all(), moved
    one = [verify.step(e, tokens[:, :1], positions[:, :1], _state(e, prompts), K, False) for e in (good, bad)]
    np.testing.assert_array_equal(one[0].top_logprobs, one[1].top_logprobs)
    np.testing.assert_array_equal(one[0].top_ids, one[1].top_ids)


def test_verify_step_has_no_races_in_tpu_interpret_mode():
    """The verify step's DMA schedule (a block's K/V written back row by row, KDA state snapshots copied out a layer)
    in TPU interpret mode with the race detector on: no race, and the generic interpreter's numbers. mini-kimi-linear:
    KDA layers (snapshots), MLA, routed experts."""
    m = load_model("mini-kimi-linear")
    tpu, generic = MegakernelEngine(m.weights, interpret="tpu"), MegakernelEngine(m.weights)
    prompts, _, tokens, positions = _block(m, generic, seed=7)
    pltpu.reset_tpu_interpret_mode_state()
    got = verify.step(tpu, tokens, positions, _state(tpu, prompts), K, False)
    assert not races_found()
    want = verify.step(generic, tokens, positions, _state(generic, prompts), K, False)
    np.testing.assert_allclose(got.top_logprobs, want.top_logprobs, atol=1e-6)
    for x, y in zip(got.snapshots, want.snapshots):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-6)
