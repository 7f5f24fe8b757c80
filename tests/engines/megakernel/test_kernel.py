"""The megakernel against the reference (rung 3 of the ladder), and its DMA discipline."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from benchmarks.detection import FAMILY_MODELS as FAMILY_MINI
from engines.megakernel import FAULTS, MegakernelEngine
from engines.megakernel.engine import BF16_RECIPE, races_found
from engines.megakernel.faults import BY_NAME
from engines.reference import ReferenceEngine

# all-f32 kernel vs all-f32 reference, 16 kernel steps: measured max |Δlogit| 7.2e-6 (mini-llama)
# and 1.9e-5 (mini-moe); the bound is the issue's, 5x above the worst seen.
F32_LOGIT_TOL = 1e-4
# bf16 kernel (bf16 weights, f32 accumulation and residual) vs the f32 reference: measured max
# |Δlogit| 0.082 (mini-llama) and 0.26 (mini-moe, outside routing flips) on logits of range ~60.
BF16_LOGIT_TOL = 0.5
# mini-moe in bf16: a near-tied routing decision can flip to another expert, a discrete change
# (one position of 68 measured, |Δlogit| 15.7). Such positions may exceed BF16_LOGIT_TOL, at most
# this share of them; everywhere else the bound and the argmax rule hold.
MOE_FLIP_SHARE = 0.03
# Residual stream after each layer at one kernel step vs the reference's hidden states (f32):
# measured max 1.5e-6 (mini-moe) on values of order 1-10.
TAPS_TOL = 1e-4
N_STEPS = 16


def _data(model, batch: int, seed: int):
    rng = np.random.default_rng(seed)
    lengths = [11, 30, 7, 19][:batch]
    prompts = [rng.integers(3, 259, size=n).tolist() for n in lengths]
    conts = [rng.integers(3, 259, size=N_STEPS + 1).tolist() for _ in prompts]
    return prompts, conts


@pytest.fixture(scope="module")
def engines(mini_llama, mini_moe):
    out = {}
    for m in (mini_llama, mini_moe):
        out[m.name] = {"ref": ReferenceEngine(m.weights), "f32": MegakernelEngine(m.weights),
                       "bf16": MegakernelEngine(m.weights, "bfloat16")}
    return out


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("name", ["mini-llama", "mini-moe"])
def test_teacher_forced_f32(engines, name, batch, request):
    prompts, conts = _data(request.getfixturevalue(name.replace("-", "_")), batch, seed=batch)
    ref = engines[name]["ref"].decode_forced(prompts, conts)
    got = engines[name]["f32"].decode_forced(prompts, conts)  # row 0: XLA prefill; rows 1..16: kernel
    worst = max(float(np.abs(a - b).max()) for a, b in zip(ref, got))
    print(f"{name} b={batch} f32 max|Δlogit| {worst:.2e}")
    assert worst <= F32_LOGIT_TOL
    for a, b in zip(ref, got):
        assert (a.argmax(-1) == b.argmax(-1)).all()


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("name", ["mini-llama", "mini-moe"])
def test_teacher_forced_bf16(engines, name, batch, request):
    prompts, conts = _data(request.getfixturevalue(name.replace("-", "_")), batch, seed=batch)
    ref = np.concatenate(engines[name]["ref"].decode_forced(prompts, conts))
    got = np.concatenate(engines[name]["bf16"].decode_forced(prompts, conts))
    delta = np.abs(ref - got).max(-1)  # per position
    over = delta > BF16_LOGIT_TOL
    print(f"{name} b={batch} bf16 max|Δlogit| {delta.max():.3f}, {over.sum()}/{len(delta)} over tol")
    assert over.mean() <= (MOE_FLIP_SHARE if name == "mini-moe" else 0.0)
    top2 = -np.sort(-ref, axis=-1)[:, :2]
    decisive = (top2[:, 0] - top2[:, 1] > BF16_LOGIT_TOL) & ~over
    assert (ref.argmax(-1) == got.argmax(-1))[decisive].all()


# bfloat16 in CI on mini-gptoss (its routing under the recipe) and mini-kimi-linear (KDA and MLA); the other
# families' bf16 cases are heavy, and Qwen3-Next's MoE variant (a gated shared expert) too
IN_CI_BF16 = ("mini-gptoss", "mini-kimi-linear")
# mini-kimi (Kimi K3: 8 layers of KDA and MLA, a latent MoE of 16 experts, attention residuals) in float32: the
# reference itself is up to 1.1e-4 from its float64 math on these prompts and the megakernel 1.1e-4 (1.2e-4 from the
# float32 reference), so the bound is twice the judge's own error (the conditioning witness's factor), not the
# shallower minis' F32_LOGIT_TOL. Its bf16 is not asserted: at 2 of 68 positions the megakernel is 1.0-2.0 from the
# reference's recipe where that recipe is itself 7-12 from float32 (routing near-ties of the latent MoE).
K3_F32_LOGIT_TOL = 2.5e-4
# mini-muse (Muse Spark: NoPE full and sliding layers, gated residuals, a normed latent MoE, capped logits) in float32:
# on these prompts the reference is up to 5.0e-4 from its own float64 math (the 140-token row) and the megakernel
# 2.3e-4 from the reference, so the bound is twice the judge's own error, as for mini-kimi. Its bf16 is judged by
# diff, not here: its sigmoid router at 2^-2.5 leaves 98% of positions' expert choice near-tied in bf16 (diff's
# routing witness on the quick prompts), and one row's prefill is already 0.09 from the recipe (0.69 later on).
MUSE_F32_LOGIT_TOL = 1e-3
FAMILY_CASES = [pytest.param(n, d, b, marks=[] if (d == "float32" or n in IN_CI_BF16) and n != "mini-qwen-next-moe"
                             else [pytest.mark.heavy])
                for n in ("mini-qwen2", "mini-gemma2", "mini-gemma3", "mini-gptoss", "mini-qwen-hybrid",
                          "mini-qwen-next-moe", "mini-kimi-linear")
                for d, b in (("float32", F32_LOGIT_TOL), ("bfloat16", BF16_LOGIT_TOL))] + \
    [pytest.param("mini-kimi", "float32", K3_F32_LOGIT_TOL), pytest.param("mini-muse", "float32", MUSE_F32_LOGIT_TOL),
     pytest.param("mini-deepseek-mla", "float32", F32_LOGIT_TOL),
     pytest.param("mini-deepseek-mla", "bfloat16", BF16_LOGIT_TOL, marks=[pytest.mark.heavy])]


@pytest.mark.parametrize("name, dtype, bound", FAMILY_CASES)
def test_family_layers_teacher_forced(name, dtype, bound):
    """The wider families' layers in the kernel and its prefill, against the f32 reference over 4 rows (one crossing
    a 128-slot tile), under the same bounds. Qwen2's q/k/v biases; Gemma 2's soft-caps, alternating 8-slot sliding
    windows, 1 + w norms, post-norms, GeGLU, embedding and query scales; Gemma 3's QK norms and sliding layers with
    their own RoPE base beside linear-scaled full layers; gpt-oss's sinks, biases, YaRN, sliding windows, biased
    softmax router and clamped-GLU experts with biases; Qwen3-Next's Gated DeltaNet layers (state carried across
    the 17 kernel steps), gated attention output and partial RoPE, and its MoE variant's gated shared expert; Kimi
    Linear's KDA layers (a decay per key channel) and NoPE MLA (keys n + r wide, values v wide, in the cache's
    expanded per-head form); Muse Spark's NoPE full layers beside sliding ones, parameter-free QK norms, per-head-normed
    gated output, gated residuals, normed latent MoE and scaled, capped logits. Measured max |Δlogit| in f32 (bf16
    against the declared recipe): mini-qwen2 5.7e-6 (0.085
    against the f32 reference), mini-qwen-hybrid 3.5e-5 (0: bitwise), mini-qwen-next-moe 2.7e-5 (0.023),
    mini-kimi-linear 9.5e-6 (0.0065); the others in the printed line."""
    from evalsuite.models import load_model

    m = load_model(name)
    rng = np.random.default_rng(0)
    V = m.config.vocab_size
    prompts = [rng.integers(3, V - 1, size=n).tolist() for n in (11, 30, 7, 140)]
    conts = [rng.integers(3, V - 1, size=N_STEPS + 1).tolist() for _ in prompts]
    # bf16 against the reference in the engine's declared recipe, as the judge runs it: against the f32 reference,
    # mini-gptoss's near-tied routing flips (1 of 68 positions at 16.0, the recipe's own bf16-vs-f32 15.98) and its
    # recipe error alone reaches 0.65 on logits of range 18
    judge = ReferenceEngine(m.weights, dtype, recipe=BF16_RECIPE) if dtype == "bfloat16" else ReferenceEngine(m.weights)
    ref = np.concatenate(judge.decode_forced(prompts, conts))
    got = np.concatenate(MegakernelEngine(m.weights, dtype).decode_forced(prompts, conts))
    delta = np.abs(ref - got).max(-1)  # per position
    print(f"{name} {dtype} max|Δlogit| {delta.max():.3g}")
    assert delta.max() <= bound
    assert (ref.argmax(-1) == got.argmax(-1)).all()


@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=pytest.mark.heavy)])
def test_mxfp4_experts_dequantised_in_vmem_are_bitwise_the_dense_ones(dtype):
    """experts=mxfp4: gpt-oss's experts stay MXFP4 in HBM (4.25 bits a weight) and are decoded in VMEM. The placement
    re-encodes the loader's float32 experts exactly (an MXFP4 value times a power of two has one mantissa bit, so
    bf16 holds it too): every logit bitwise the dense path's. Weights MXFP4 cannot hold are refused in one line."""
    from engines.errors import ModelError
    from evalsuite.models import load_model

    m = load_model("mini-gptoss")
    prompts, conts = _data(m, 2, seed=3)
    dense = MegakernelEngine(m.weights, dtype).decode_forced(prompts, conts)
    eng = MegakernelEngine(m.weights, dtype, experts="mxfp4")
    assert {str(eng.hbm[k].dtype) for k in eng.hbm if k.endswith(("_q", "_s"))} == {"uint8"} and "e_gate" not in eng.hbm
    for a, b in zip(dense, eng.decode_forced(prompts, conts)):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ModelError, match="^--engine-option experts=mxfp4: e_gate: weights MXFP4 cannot hold exactly"):
        MegakernelEngine(load_model("mini-moe").weights, experts="mxfp4")


def test_bf16_kv_cache_matches_its_declared_recipe(mini_llama):
    """kv_cache=bfloat16: the cache stored in bf16 (half the bytes a step reads) and declared in the recipe. Mean
    |Δlogit| over 4 rows x 17 kernel steps (mini-llama, seeds 0-3): against the reference in that recipe 1.4e-6 to
    1.5e-3, against the recipe with a float32 cache 9.2e-3 to 9.8e-3 (max 0.030 and 0.063 at seed 1, inside the bf16
    bound). The mean bound sits between: the judge's recipe has to be the engine's."""
    from dataclasses import replace

    rng = np.random.default_rng(1)
    prompts = [rng.integers(3, 259, size=n).tolist() for n in (11, 30, 7, 140)]
    conts = [rng.integers(3, 259, size=N_STEPS + 1).tolist() for _ in prompts]
    eng = MegakernelEngine(mini_llama.weights, "bfloat16", kv_cache="bfloat16")
    assert eng.recipe.kv_cache == "bfloat16"
    _, low = eng.lower_decode(8, 256)
    assert [d for s, d, _ in low.kernel().args if s == (8, 2, 128, 16)] == ["bf16"] * 4  # the KV tile buffers
    got = eng.decode_forced(prompts, conts)

    def gap(kv: str) -> tuple[float, float]:
        ref = ReferenceEngine(mini_llama.weights, "bfloat16", recipe=replace(eng.recipe, kv_cache=kv))
        d = [np.abs(a - b) for a, b in zip(ref.decode_forced(prompts, conts), got)]
        return max(float(x.max()) for x in d), float(np.mean([x.mean() for x in d]))

    (own_max, own_mean), (_, other_mean) = gap("bfloat16"), gap("float32")
    assert own_max <= BF16_LOGIT_TOL and own_mean <= 3e-3 < 5e-3 <= other_mean
    assert MegakernelEngine(mini_llama.weights, "float32", kv_cache="bfloat16").kv_cache == "float32"


def test_dense_mlp_streams_in_chunks(mini_llama, monkeypatch):
    """The dense MLP in 4 column chunks (the chunk budget shrunk to 24 KiB, mini-llama's width 128 in chunks of 32):
    the same bound against the reference as unchunked, and in TPU interpret mode no race between chunk buffers."""
    from engines.megakernel import spec

    monkeypatch.setattr(spec, "MLP_CHUNK_BYTES", 3 * 64 * 32 * 4)
    assert spec.mlp_chunks(mini_llama.config, "float32") == 4
    prompts, conts = _data(mini_llama, 2, seed=7)
    conts = [c[:6] for c in conts]
    ref = ReferenceEngine(mini_llama.weights).decode_forced(prompts, conts)
    pltpu.reset_tpu_interpret_mode_state()
    eng = MegakernelEngine(mini_llama.weights, interpret="tpu")
    assert eng.hbm["gate"].shape[1] == 4
    got = eng.decode_forced(prompts, conts)
    assert not races_found()
    assert max(float(np.abs(a - b).max()) for a, b in zip(ref, got)) <= F32_LOGIT_TOL


@pytest.mark.parametrize("name", ["mini-llama", "mini-moe"])
def test_taps_match_reference_hidden_states(engines, name, request):
    prompts, _ = _data(request.getfixturevalue(name.replace("-", "_")), 4, seed=9)
    nxt = [5, 77, 130, 9]
    taps = engines[name]["f32"].step_taps(prompts, nxt)  # [rows, L, D]
    for p, t, row in zip(prompts, nxt, taps):
        want = engines[name]["ref"].score([p + [t]], want_taps=True)[0].taps[:, -1]  # [L, D]
        assert np.abs(row - want).max() <= TAPS_TOL


@pytest.mark.parametrize("interpret", ["generic", "tpu"])
def test_kv_slots_past_written_positions_untouched(mini_moe, interpret):
    """One kernel step writes exactly one slot per (layer, row): every other slot keeps its bytes."""
    eng = MegakernelEngine(mini_moe.weights, interpret=interpret)
    c = mini_moe.config
    rng = np.random.default_rng(0)
    shape = (c.n_layers, 4, c.n_kv_heads, 32, c.head_dim)
    kc0 = rng.standard_normal(shape).astype(np.float32)
    vc0 = rng.standard_normal(shape).astype(np.float32)
    pos = np.array([3, 17, 0, 31], np.int32)
    out = eng._decode(eng.w, jnp.asarray([5, 6, 7, 8]), jnp.asarray(pos), (jnp.asarray(kc0), jnp.asarray(vc0)))
    kc, vc = np.asarray(out[1][0]), np.asarray(out[1][1])
    written = np.zeros(shape, bool)
    for b, p in enumerate(pos):
        written[:, b, :, p, :] = True
    np.testing.assert_array_equal(kc[~written], kc0[~written])
    np.testing.assert_array_equal(vc[~written], vc0[~written])
    assert not np.allclose(kc[written], kc0[written])  # and the new slot was written


@pytest.mark.parametrize("interpret", ["generic", "tpu"])
def test_unwritten_cache_slots_never_reach_the_output(mini_moe, interpret):
    """Every cache slot at or past a row's position filled with NaN (as JAX's Pallas tests poison padding): the step's
    output is finite and bitwise the one over finite garbage there. Rows at 40 and 150 of a 256-slot window: tile 0
    is read by both, tile 1 holds row 0's unwritten slots only."""
    eng = MegakernelEngine(mini_moe.weights, interpret=interpret)
    c = mini_moe.config
    rng = np.random.default_rng(1)
    shape = (c.n_layers, 2, c.n_kv_heads, 256, c.head_dim)
    kc, vc = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape).astype(np.float32)
    pos = np.array([40, 150], np.int32)
    kn, vn = kc.copy(), vc.copy()
    for b, p in enumerate(pos):
        kn[:, b, :, p:] = np.nan
        vn[:, b, :, p:] = np.nan
    step = lambda k, v: np.asarray(eng._decode(eng.w, jnp.asarray([5, 6]), jnp.asarray(pos),  # noqa: E731
                                               (jnp.asarray(k), jnp.asarray(v)), window=256)[0])
    poisoned = step(kn, vn)
    assert np.isfinite(poisoned).all()
    np.testing.assert_array_equal(poisoned, step(kc, vc))


# mini-kimi-linear in CI: routed experts, KDA state and MLA's two tile widths in one kernel; the others heavy
@pytest.mark.parametrize("name", ["mini-llama", "mini-kimi-linear"] + [pytest.param(n, marks=pytest.mark.heavy)
                                                                       for n in ("mini-moe", "mini-qwen-hybrid")])
def test_tpu_interpret_mode_has_no_races(name):
    """Full kernel in TPU interpret mode (DMAs simulated eagerly, race detector on): no race, and
    the same numbers as the generic interpreter. The hybrids: a GDN or KDA layer's state read with its weights into
    a buffer slot and written back from it, waited for before the slot is reused; MLA's K and V tiles of two
    widths."""
    from evalsuite.models import load_model

    m = load_model(name)
    prompts, conts = _data(m, 2, seed=3)
    conts = [c[:4] for c in conts]
    pltpu.reset_tpu_interpret_mode_state()
    got = MegakernelEngine(m.weights, interpret="tpu").decode_forced(prompts, conts)
    assert not races_found()
    want = MegakernelEngine(m.weights).decode_forced(prompts, conts)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_race_detector_is_live(mini_llama):
    """Negative control: the same kernel with ONE weight buffer prefetches layer l+1 over the
    weights layer l is still reading. The detector must flag it (and the numbers go wrong)."""
    prompts, conts = _data(mini_llama, 1, seed=3)
    conts = [c[:3] for c in conts]
    pltpu.reset_tpu_interpret_mode_state()
    bad = MegakernelEngine(mini_llama.weights, interpret="tpu", n_buffers=1).decode_forced(prompts, conts)
    assert races_found()
    pltpu.reset_tpu_interpret_mode_state()
    good = MegakernelEngine(mini_llama.weights).decode_forced(prompts, conts)
    assert np.abs(bad[0][1:] - good[0][1:]).max() > 1e-2


def _tiled_step(m, interpret, kv_buffers: int):
    """One kernel step over a 64-slot window in 4 tiles of 16 (the engine's own tile is 128, so its short
    prompts read one tile: this is what exercises the KV tiles' double buffer)."""
    from engines.megakernel.kernel import KernelSpec, decode_layers

    eng = MegakernelEngine(m.weights)
    c = m.config
    rng = np.random.default_rng(5)
    shape = (c.n_layers, 2, c.n_kv_heads, 64, c.head_dim)
    kc, vc = (jnp.asarray(rng.standard_normal(shape).astype(np.float32)) for _ in range(2))
    spec = KernelSpec(c, 2, 64, 16, 64, interpret=interpret, kv_buffers=kv_buffers)
    x = eng.embed[jnp.asarray([5, 6])].astype(jnp.float32)
    return np.asarray(decode_layers(spec, eng.hbm, x, jnp.asarray([40, 63], jnp.int32), kc, vc, eng.rope)[0])


@pytest.mark.parametrize("name", ["mini-llama", "mini-gemma2"])
def test_kv_tiles_double_buffered_without_races(name):
    """The KV cache streams through VMEM in tiles, tile t+1's copy under tile t's math: in TPU interpret mode
    (eager DMAs, race detector on) no race, the generic interpreter's numbers; with ONE tile buffer (the next
    tile copied over the one being read) the detector must flag it and the numbers go wrong. mini-gemma2's sliding
    layers (window 8) start at a tile found at run time (rows at 40 and 63: tile 2 of 4)."""
    from engines.megakernel.engine import tpu_interpret_params
    from evalsuite.models import load_model

    m = load_model(name)
    want = _tiled_step(m, True, 2)
    pltpu.reset_tpu_interpret_mode_state()
    got = _tiled_step(m, tpu_interpret_params(), 2)
    assert not races_found()
    np.testing.assert_allclose(got, want, atol=1e-6)
    pltpu.reset_tpu_interpret_mode_state()
    bad = _tiled_step(m, tpu_interpret_params(), 1)
    assert races_found()
    assert np.abs(bad - want).max() > 1e-2


# Each fault must move the kernel's logits by more than this (teacher-forced, mini-moe, 2 rows, one of
# them crossing the 128-slot attention tile boundary), yet stay a "small" bug: finite, no larger than
# the logit range. Two are subtle by nature and must only leave the faithful kernel's bound (F32_LOGIT_TOL):
# batch_variant differs in the last bits, and norm_eps (1e-6 for 1e-5) moves mini-moe's logits by 4.0e-4
# and mini-llama's by only 9.5e-5, under the bound (measured; their hidden states have RMS near 1, so
# epsilon barely matters): it is tested on mini-moe. (SmolLM2's embeddings have mean square 0.018.)
FAULT_MIN_DELTA = 0.05
# l2_eps_outside moves mini-qwen-lownorm's logits by 0.050 at most on these prompts (its near-dead head's q and k
# shrink by about 1%): subtle by nature too.
SUBTLE = {"norm_eps": F32_LOGIT_TOL, "l2_eps_outside": F32_LOGIT_TOL}
SHORT = [11, 30]  # one 64-slot window: one kernel compilation per fault
CROSSING = [126, 30]  # row 0 runs from position 126 to 142: windows of 128 and 256 slots (1 and 2 tiles)


BF16_ONLY = [f for f in FAULTS if BY_NAME[f].needs.startswith("bf16")]  # one extra rounding: a float32 no-op
# Gemma 2's cap is 50: a masked slot capped to -50 weighs e^-50 (2e-22) of the largest score's, nothing in float32.
# (l2_eps_outside moves mini-qwen-hybrid's logits by 6.8e-5 at most, under the float32 bound: its q and k norms are
# near 2; it runs on mini-qwen-lownorm, whose near-dead head shows it)
BENIGN = {"softcap_after_mask"}


FAITHFUL: dict = {}  # (mini, MXFP4 experts, long prompts) -> the faithful kernel's logits on the faults' prompts


# the seed layers' faults: one per mini in CI (the rest heavy; the detection table has each: docs/faults.md)
SEED_HEAVY = {"conv_unshifted", "l2_eps_outside", "mla_scale_padded", "router_bias_in_weights", "latent_norm_padded",
              "mla_uk_transposed", "mla_pe_rotated"}  # these two's CI cases: test_mla.py


@pytest.mark.parametrize("fault", [pytest.param(f, marks=[pytest.mark.heavy] if f in SEED_HEAVY else [])
                                   for f in FAULTS if f not in BF16_ONLY])
def test_each_fault_changes_output(engines, mini_llama, mini_moe, fault):
    """Dense faults on mini-llama, MoE ones on mini-moe (the cheaper kernel where it shows), a family's own on its
    mini (FAMILY_MINI)."""
    from evalsuite.models import load_model

    needs = BY_NAME[fault].needs
    model = load_model(FAMILY_MINI[needs]) if needs in FAMILY_MINI else \
        mini_moe if needs == "moe" or fault == "norm_eps" else mini_llama
    rng = np.random.default_rng(5)
    long = BY_NAME[fault].needs == "tiles" or fault == "rope_theta"  # RoPE base errors grow with the position
    prompts = [rng.integers(3, 259, size=n).tolist() for n in (CROSSING if long else SHORT)]
    conts = [rng.integers(3, 259, size=N_STEPS + 1).tolist() for _ in prompts]
    # a family fault's faithful twin: the same mini, MXFP4 experts for the MXFP4 fault (its logits computed once a
    # session for every fault of that mini: the prompts depend only on `long`)
    key = (model.name, needs == "mxfp4", long)
    faithful = engines[model.name]["f32"] if model.name in engines else \
        MegakernelEngine(model.weights, experts="mxfp4" if needs == "mxfp4" else None)  # specs shared: cheap
    if key not in FAITHFUL:
        FAITHFUL[key] = faithful.decode_forced(prompts, conts)
    good = FAITHFUL[key]
    eng = MegakernelEngine(model.weights, fault=fault)
    bad = eng.decode_forced(prompts, conts)
    deltas = []
    for g, b in zip(good, bad):
        assert np.isfinite(b).all()
        np.testing.assert_allclose(b[0], g[0], atol=F32_LOGIT_TOL)  # row 0 is prefill: no fault there
        deltas.append(np.abs(b[1:] - g[1:]).max())
    print(fault, [f"{d:.3g}" for d in deltas])
    if fault == "batch_variant":  # last bits only, and only with more than one row
        assert 0 < max(deltas) < F32_LOGIT_TOL
    elif fault in BENIGN:
        assert max(deltas) < F32_LOGIT_TOL
    else:
        # changed, within the logits' order of magnitude (garbage expert weights may exceed their range, not explode)
        assert SUBTLE.get(fault, FAULT_MIN_DELTA) < max(deltas) < 4 * np.abs(good[0]).max()
    if BY_NAME[fault].needs == "batch":  # the rows are what it breaks: row 0 alone is exactly the faithful one
        np.testing.assert_array_equal(eng.decode_forced(prompts[:1], conts[:1])[0],
                                      faithful.decode_forced(prompts[:1], conts[:1])[0])


@pytest.mark.parametrize("fault", BF16_ONLY)
def test_bf16_only_faults_are_float32_noops(engines, mini_llama, fault):
    """A rounding the recipe does not have: bitwise nothing in float32, a change in bfloat16 (past 256 positions
    for the rounded position), on the kernel's decode steps only."""
    rng = np.random.default_rng(6)
    prompts = [rng.integers(3, 259, size=n).tolist() for n in (300, 30)]
    conts = [rng.integers(3, 259, size=N_STEPS + 1).tolist() for _ in prompts]
    for a, b in zip(engines["mini-llama"]["f32"].decode_forced(prompts, conts),
                    MegakernelEngine(mini_llama.weights, fault=fault).decode_forced(prompts, conts)):
        np.testing.assert_array_equal(a, b)
    good = engines["mini-llama"]["bf16"].decode_forced(prompts, conts)
    bad = MegakernelEngine(mini_llama.weights, "bfloat16", fault=fault).decode_forced(prompts, conts)
    deltas = [float(np.abs(b[1:] - g[1:]).max()) for g, b in zip(good, bad)]
    print(fault, deltas)
    for g, b in zip(good, bad):
        assert np.isfinite(b).all()
        np.testing.assert_array_equal(b[0], g[0])  # the prefill's row: no fault there
    assert max(deltas) > 1e-3


def test_router_fault_needs_moe(mini_llama):
    from engines.errors import ModelError

    with pytest.raises(ModelError, match="needs a MoE model"):
        MegakernelEngine(mini_llama.weights, fault="router_second_choice")


def test_every_fault_is_in_the_docs_catalogue():
    from pathlib import Path

    from evalsuite.doctables import fault_catalogue

    root = Path(__file__).resolve().parents[3]
    page = (root / "docs" / "faults.md").read_text("utf-8")
    table = fault_catalogue(root)
    assert all(f"| `{name}` |" in table for name in MegakernelEngine.faults)
    assert table in page, ("docs/faults.md's fault table differs from the megakernel's catalogue "
                           "(engines/megakernel/faults.py); regenerate it: python -m evalsuite.docgen")



@pytest.mark.parametrize("context", [200, 100, 256])
def test_kv_read_is_the_attended_positions_rounded_to_a_piece(mini_llama, monkeypatch, context):
    """The KV the kernel's DMAs move in TPU interpret mode, counted at the copies themselves, at one decode step
    over `context` cached positions: whole tiles, then the last attended tile in PIECE-position pieces, as the
    roofline (benchmarks/roofline.py) counts it; at 200, 208 positions a layer where whole tiles read 256."""
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    from benchmarks.roofline import kv_positions
    from engines.megakernel.attention import PIECE
    from engines.megakernel.engine import ATTN_TILE

    c = mini_llama.config
    moved: list[tuple[int, ...]] = []
    read = ipc.DMA.execute_read

    def counted(self):
        read(self)
        moved.append(tuple(self.data.shape))

    monkeypatch.setattr(ipc.DMA, "execute_read", counted)
    pltpu.reset_tpu_interpret_mode_state()
    eng = MegakernelEngine(mini_llama.weights, interpret="tpu")
    prompt = list(np.random.default_rng(3).integers(1, 250, context))
    eng.generate([prompt], 2)  # the first token from the prefill, the second from one decode step at `context`
    kv = [s for s in moved if len(s) == 4 and s[0] == 1 and s[1] == c.n_kv_heads and s[3] == c.head_dim]
    per_layer = sum(s[2] for s in kv) // (2 * c.n_layers)  # K and V
    assert per_layer == kv_positions(c, context, ATTN_TILE)[0] // c.n_layers
    assert per_layer == (-(-context // PIECE) * PIECE if context % ATTN_TILE else context)
