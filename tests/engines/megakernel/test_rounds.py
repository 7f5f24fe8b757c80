"""The bf16 recipe's rounding points in the linear-attention layers (engines.recipe.ROUND_POINTS; --engine-option
rounds): the megakernel rounds where it declares, and the judge's reference in that recipe rounds there too."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from engines.base import ROUND_POINTS
from engines.errors import ModelError
from engines.megakernel import MegakernelEngine
from engines.reference import ReferenceEngine
from evalsuite.models import load_model

# Mean |Δlogit| over 4 rows x 13 kernel steps (seed 1) between the bf16 megakernel with rounds=R and the bf16
# reference, in the engine's declared recipe and in that recipe without the points. Measured: in its own recipe 0
# (mini-qwen-hybrid, public), 9.1e-4 / 1.1e-3 / 7.7e-4 / 1.1e-4 (its single points: projections, conv, beta,
# out_gate), 1.6e-3 (mini-kimi-linear, public), 1.8e-3 (its beta); without the points 1.6e-2 to 3.3e-2. OWN_MEAN
# sits above the first by 1.7x, SEPARATION below the second by 1.6x: a side that skips one point lands between.
OWN_MEAN = 3e-3
SEPARATION = 1e-2
N_STEPS = 12
CASES = [("mini-qwen-hybrid", "public"), ("mini-kimi-linear", "public")] + [
    pytest.param("mini-qwen-hybrid", p, marks=pytest.mark.heavy) for p in ROUND_POINTS]


@pytest.mark.parametrize("name, rounds", CASES)
def test_rounding_points_match_the_declared_recipe(name, rounds):
    """The engine's logits are the reference's in the declared recipe (mean gap under OWN_MEAN) and not the
    recipe without the points (over SEPARATION): both sides round at every declared point."""
    m = load_model(name)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(3, m.config.vocab_size, size=n).tolist() for n in (11, 30, 7, 40)]
    conts = [rng.integers(3, m.config.vocab_size, size=N_STEPS + 1).tolist() for _ in prompts]
    eng = MegakernelEngine(m.weights, "bfloat16", rounds=rounds)
    assert eng.recipe.rounds == eng.rounds and eng.rounds and "rounds" in eng.recipe.describe()
    got = eng.decode_forced(prompts, conts)

    def mean_gap(points) -> float:
        ref = ReferenceEngine(m.weights, "bfloat16", recipe=replace(eng.recipe, rounds=points))
        return float(np.mean([np.abs(a - b).mean() for a, b in zip(ref.decode_forced(prompts, conts), got)]))

    assert mean_gap(eng.rounds) <= OWN_MEAN < SEPARATION <= mean_gap(())


def test_public_points_follow_the_layer_kind():
    """Kimi's KDA keeps beta float32, Qwen's GDN rounds it; float32 is float32; bad values are one-line errors."""
    from engines.megakernel.checks import round_points

    kimi, qwen = load_model("mini-kimi-linear").config, load_model("mini-qwen-hybrid").config
    assert round_points(kimi, "bfloat16", "public") == ("projections", "conv", "out_gate")
    assert round_points(qwen, "bfloat16", "public") == tuple(ROUND_POINTS)
    assert round_points(qwen, "bfloat16", "out_gate, conv") == ("conv", "out_gate")  # ROUND_POINTS' order
    assert round_points(qwen, "float32", "public") == () == round_points(qwen, "bfloat16", "none")
    with pytest.raises(ModelError, match="^--engine-option rounds=conv,gates: unknown point 'gates'; expected"):
        round_points(qwen, "bfloat16", "conv,gates")
    with pytest.raises(ModelError, match="linear-attention .* mini-muse has none$"):
        round_points(load_model("mini-muse").config, "bfloat16", "public")


# residual=bfloat16 (the public Kimi and Qwen kernels' stream): mean |Δlogit| of the bf16 megakernel against the
# reference in its declared recipe, over the same against that recipe with a float32 stream (4 rows x 13 kernel
# steps, seed 1). Measured: 4.4x (mini-llama, 0.0042 against 0.018), 7.3x (mini-muse's gated stream, 0.087 against
# 0.63; its default recipe's own gap is 0.086 as well), 45x (mini-kimi's attention residuals), and 0 against 0.029
# (mini-qwen-hybrid). A stream rounded on one side only stays at 1x.
RESIDUAL_SEPARATION = 3.0


@pytest.mark.parametrize("name", ["mini-llama", "mini-muse", pytest.param("mini-kimi", marks=pytest.mark.heavy)])
def test_bf16_residual_stream_matches_the_declared_recipe(name):
    m = load_model(name)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(3, m.config.vocab_size, size=n).tolist() for n in (11, 30, 7, 40)]
    conts = [rng.integers(3, m.config.vocab_size, size=N_STEPS + 1).tolist() for _ in prompts]
    eng = MegakernelEngine(m.weights, "bfloat16", residual="bfloat16")
    assert eng.recipe.residual == "bfloat16" == eng.recipe.describe()["residual"]
    got = eng.decode_forced(prompts, conts)

    def mean_gap(residual: str) -> float:
        ref = ReferenceEngine(m.weights, "bfloat16", recipe=replace(eng.recipe, residual=residual))
        return float(np.mean([np.abs(a - b).mean() for a, b in zip(ref.decode_forced(prompts, conts), got)]))

    assert RESIDUAL_SEPARATION * mean_gap("bfloat16") < mean_gap("float32")
    assert MegakernelEngine(m.weights, "float32", residual="bfloat16").residual == "float32"  # float32 is float32
