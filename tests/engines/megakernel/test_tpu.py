"""The megakernel lowered for TPU on this CPU host, its VMEM budget, and what it refuses.

Lowering runs Pallas' TPU lowering and hands Mosaic a module; Mosaic's own compile needs a TPU (docs/tpu.md).
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest

from engines.errors import ModelError, UnsupportedModel
from engines.loop import MIN_WINDOW, cache_slots
from engines.megakernel import MegakernelEngine, tpu
from engines.megakernel import budget as budget_mod
from engines.megakernel import ops as mk_ops
from engines.megakernel.budget import budget, tiled_bytes
from engines.megakernel.engine import MAX_BATCH
from engines.megakernel.faults import ALL_FAULTS, BY_NAME, MODEL_NEEDS, knobs
from engines.megakernel.tpu import Chip
from engines.recipe import public_rounds

MOSAIC_DTYPES = {"f32": "float32", "bf16": "bfloat16", "i32": "int32", "i8": "uint8"}
BATCHES = (1, 2, 4, 8)  # the kernel's row buckets (engines.loop pads rows to a power of two, at most MAX_BATCH)


def windows(max_context: int) -> list[int]:
    """Every window bucket a decode step can read (engines.loop.cache_slots from one tile to the context)."""
    return sorted({cache_slots(n, max_context) for n in range(1, max_context + 1, 32)})


def kernel_faults(config, own_only: bool = False) -> list[str]:
    """The faults that change the kernel program itself (the others act on the host or the head) and that the
    model has the layers for; own_only: only those of its family's own layers (sliding windows, soft-caps, ...)."""
    needs = lambda f: BY_NAME[f].needs  # noqa: E731
    return [f for f in ALL_FAULTS if knobs(f).only("kernel") != knobs(None).only("kernel")
            and (needs(f) not in MODEL_NEEDS or MODEL_NEEDS[needs(f)][1](config))
            and (not own_only or needs(f) in MODEL_NEEDS and needs(f) != "moe")]


def check_lowered(eng: MegakernelEngine, batch: int, window: int, want_taps: bool = False, block: int = 1):
    spec, low = eng.lower_decode(batch, window, want_taps, block)
    k = low.kernel("decode_megakernel")
    b = budget(spec, eng.dtype, eng.chip)
    vmem = sum(tiled_bytes(shape, MOSAIC_DTYPES[d]) for shape, d, space in k.args if space == "vmem")
    assert vmem == b.declared, (batch, window, vmem, b.declared)  # the budget counts what Mosaic is asked for
    assert k.vmem_limit_bytes == b.limit  # and passes its limit
    assert not k.refused_reshapes  # every vector reshape one Mosaic's layout pass accepts (seen on a TPU v5e)
    c = eng.config
    # RoPE by lane rotation, its tables one row each (no permutation matrix); Kimi's MLA layers have no RoPE
    assert k.ops["tpu.dynamic_rotate"] > 0 or not c.attn_layers
    # first and freq (full, sliding) rows of q, then of k
    assert [a[0] for a in k.args[5:9]] == [(n, h * c.head_dim) for h in (c.n_heads, c.n_kv_heads) for n in (1, 2)]
    return spec, k


# dense, MoE, Qwen2's biases, Gemma 2's soft-caps and windows, Gemma 3's two RoPEs, gpt-oss's sinks and experts,
# Qwen3-Next's GDN layers (and their state), gated attention and partial RoPE, its MoE variant's gated shared expert,
# Kimi Linear's KDA layers and NoPE MLA, Kimi K3's (bounded KDA gate, gated MLA, latent MoE, attention residuals),
# Muse Spark's (NoPE full layers, weightless QK and output norms, gated residuals, its normed latent MoE),
# DeepSeek-V3's RoPE'd MLA (q_pe and k_pe turned by lane rolls)
FAMILIES = ("mini-qwen2", "mini-gemma2", "mini-gemma3", "mini-gptoss", "mini-qwen-hybrid", "mini-qwen-next-moe",
            "mini-kimi-linear", "mini-kimi", "mini-muse", "mini-deepseek-mla")
# in bfloat16, CI lowers these families (the others' bf16 builds differ only in dtypes: the heavy cross product)
BF16_FAMILIES = ("mini-gptoss", "mini-kimi-linear")


def _engines(dtype: str, names, mini_llama, mini_moe):
    from evalsuite.models import load_model

    return [(m.weights, MegakernelEngine(m.weights, dtype)) for m in (mini_llama, mini_moe,
                                                                      *[load_model(n) for n in names])]


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def lowering_engines(request, mini_llama, mini_moe):
    return _engines(request.param, FAMILIES if request.param == "float32" else BF16_FAMILIES, mini_llama, mini_moe)


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def every_lowering_engine(request, mini_llama, mini_moe):
    """Every family in both dtypes (the heavy cross product)."""
    return _engines(request.param, FAMILIES, mini_llama, mini_moe)


def test_each_configuration_axis_lowers_for_tpu(lowering_engines):
    """Every value of every axis lowered: family (dense, MoE, Qwen2, Gemma 2 and 3, gpt-oss), dtype, KV dtype, the
    bf16 residual and rounding points, batch
    bucket, window (the first, one of two tiles, the last), taps, the verify step (block 4) with its fault, and each
    kernel fault in the dtype where it acts (a
    bf16-only fault is a float32 no-op; a family mini takes its own faults). The full cross product is the heavy
    test below."""
    for weights, eng in lowering_engines:
        ws = windows(eng.config.max_context)
        own = eng.config.name not in ("mini-llama", "mini-moe")
        # every batch and window bucket on mini-llama and mini-moe; a family once, at two tiles with taps
        for b, w in zip(BATCHES, (ws[0], ws[1], ws[-1], ws[0])) if not own else [(2, ws[1])]:
            check_lowered(eng, b, w, want_taps=b == 1 or own)
        for f in kernel_faults(eng.config, own_only=own):  # a family's own faults: in float32 (heavy: both)
            if BY_NAME[f].needs.startswith("bf16") == (eng.dtype == "bfloat16") or own and eng.dtype == "float32":
                check_lowered(MegakernelEngine(weights, eng.dtype, fault=f), 2, 2 * MIN_WINDOW)
        if eng.config.expert_act == "gptoss":  # MXFP4 experts: codes and scales in uint8 VMEM buffers, counted so
            check_lowered(MegakernelEngine(weights, eng.dtype, experts="mxfp4"), 4, 3 * MIN_WINDOW)
        if eng.dtype == "bfloat16":  # the bf16 KV cache: its tiles and staging in bf16, counted so by the budget
            check_lowered(MegakernelEngine(weights, eng.dtype, kv_cache="bfloat16"), 4, 3 * MIN_WINDOW)
            # the public kernels' recipe: the stream rounded after every add, and the family's rounding points
            public = "public" if public_rounds(eng.config) else None
            check_lowered(MegakernelEngine(weights, eng.dtype, kv_cache="bfloat16", residual="bfloat16",
                                           rounds=public), 2, 2 * MIN_WINDOW)
        # the speculative verify step (4 query rows a cache row; a recurrent model's state snapshots), every family
        check_lowered(eng, 2, ws[1], block=4)
        if eng.config.name == "mini-llama":  # and its one fault, the block's causal mask off by one
            check_lowered(MegakernelEngine(weights, eng.dtype, verify_fault="block_mask_ahead"), 2, ws[1], block=4)


def test_kimi_k3s_public_recipe_lowers_for_tpu():
    """Kimi K3's public bf16 recipe rounds inside MLA layers, the latent MoE and the depth mixture (besides KDA's
    points and the stream): those roundings lower as well (the bf16 families above have none of the three)."""
    from evalsuite.models import load_model

    eng = MegakernelEngine(load_model("mini-kimi").weights, "bfloat16", kv_cache="bfloat16", residual="bfloat16",
                           rounds="public")
    assert {"mla", "latent_moe", "attn_res"} <= set(eng.rounds)
    check_lowered(eng, 2, 2 * MIN_WINDOW)


@pytest.mark.heavy
def test_every_configuration_lowers_for_tpu(every_lowering_engine):
    """Each family x dtype x batch bucket x window bucket, and each kernel fault at every batch bucket."""
    for weights, eng in every_lowering_engine:
        for b, w in itertools.product(BATCHES, windows(eng.config.max_context)):
            check_lowered(eng, b, w)
        for f, b in itertools.product(kernel_faults(eng.config), BATCHES):
            check_lowered(MegakernelEngine(weights, eng.dtype, fault=f), b, 2 * MIN_WINDOW)


def test_kv_and_experts_stay_tiles_whatever_the_window(mini_moe):
    """VMEM does not grow with the window (the cache streams in tiles) nor with the expert count (two expert slots)."""
    eng = MegakernelEngine(mini_moe.weights)
    small, _ = check_lowered(eng, MAX_BATCH, MIN_WINDOW)
    large, _ = check_lowered(eng, MAX_BATCH, mini_moe.config.max_context)
    assert budget(small, "float32").declared == budget(large, "float32").declared
    experts = [i for i in budget(large, "float32").items if i.group == "experts"]
    assert [i.count for i in experts] == [2, 2, 2] and all(i.shape[0] == mini_moe.config.hidden or
                                                           i.shape[1] == mini_moe.config.hidden for i in experts)


def test_a_step_that_cannot_fit_is_refused_in_one_line(mini_llama, monkeypatch):
    """A chip with too little VMEM: the engine refuses at construction, naming the largest part and what to shrink."""
    tiny = Chip("v7", 4 << 20, 3.7e12, 1.155e15, 2)
    monkeypatch.setattr(budget_mod, "chip", lambda name: tiny)
    with pytest.raises(UnsupportedModel) as e:
        MegakernelEngine(mini_llama.weights)
    msg = str(e.value)
    assert "\n" not in msg and "kv tiles 4.0 MiB" in msg and "smaller batch or attention tile" in msg
    assert "TPU v7 (4.0 MiB a TensorCore)" in msg


def test_bad_chip_and_mosaic_without_tpu_are_refused(mini_llama):
    with pytest.raises(ModelError, match="chip='v9'"):
        MegakernelEngine(mini_llama.weights, chip="v9")
    with pytest.raises(ModelError, match="needs a TPU; jax here runs on cpu"):
        MegakernelEngine(mini_llama.weights, interpret="mosaic")


# Reshapes compiled, or refused, on a TPU v5e by Mosaic (jax 0.10.2): src, dst, element bits
ACCEPTED = [((4, 64), (4, 4, 16), 32), ((4, 4, 16), (8, 2, 16), 32), ((4, 2, 16), (8, 16), 32),
            ((4, 64), (4, 2, 2, 16), 16), ((4, 96), (4, 4, 24), 32), ((8, 256), (8, 2, 128), 32),
            ((4, 256), (8, 128), 32), ((4, 16), (4, 16, 1), 32), ((4, 64), (4, 1, 64), 16)]
REFUSED = [((4, 64), (8, 2, 16), 32), ((4, 64), (16, 16), 32), ((4, 128), (16, 32), 32),
           ((4, 96), (16, 1, 24), 32), ((8, 2, 16), (4, 64), 32), ((4, 16), (4, 16, 1), 16)]


def test_shape_cast_rule_matches_what_mosaic_did_on_a_tpu():
    assert all(tpu.shape_cast_ok(*c) for c in ACCEPTED)
    assert not any(tpu.shape_cast_ok(*c) for c in REFUSED)
    # two legal casts back to back are folded into one, which Mosaic refused
    text = (' %5 = "vector.shape_cast"(%4) : (vector<4x64xf32>) -> vector<4x4x16xf32>\n'
            ' %6 = "vector.shape_cast"(%5) : (vector<4x4x16xf32>) -> vector<8x2x16xf32>\n')
    assert tpu.refused_reshapes(text) == ("(4, 64) -> (8, 2, 16) (32-bit)",)
    apart = text.replace("(%5)", "(%9)").replace(" %6", " %9 = arith.addf(%5, %5)\n %6")
    assert tpu.refused_reshapes(apart) == ()


def test_the_head_split_mosaic_refused_is_caught_on_the_host(mini_llama, monkeypatch):
    """The kernel's first TPU compile failed at [B, H*hd] -> [B*K, G, hd] in one reshape; ops.reshape stages it.
    With the plain reshape put back, the host-side check names that cast."""
    eng = MegakernelEngine(mini_llama.weights, "float32")
    monkeypatch.setattr(mk_ops, "reshape", lambda x, *shape: x.reshape(shape))
    _, low = eng.lower_decode(4, 256)
    assert "(4, 64) -> (8, 2, 16) (32-bit)" in low.kernel().refused_reshapes


def test_budget_command():
    def cmd(*args):
        return subprocess.run([sys.executable, "-m", "benchmarks.vmem", *args], capture_output=True, text=True,
                              timeout=300)

    p = cmd("--model", "mini-moe", "--model", "k3-sized", "--chip", "v7", "--chip", "v6e", "--dtype", "bfloat16",
            "--json")
    assert p.returncode == 0, p.stderr
    rows = {(r["model"], r["budget"]["chip"]): r["budget"] for r in json.loads(p.stdout)}
    assert rows[("mini-moe", "v7")]["fits"] and rows[("mini-moe", "v7")]["capacity_bytes"] == 64 << 20
    assert rows[("mini-moe", "v6e")]["capacity_bytes"] == 128 << 20
    assert not rows[("k3-sized", "v7")]["fits"]  # a layer's dense weights alone exceed VMEM
    text = cmd("--model", "k3-sized", "--chip", "v7", "--dtype", "bfloat16").stdout
    assert "DOES NOT FIT" in text and "weights" in text
    bad = cmd("--chip", "v9")
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "v9" in bad.stderr


def test_tpu_scripts_refuse_a_host_without_a_tpu_and_the_probe_runs_in_interpret_mode(tmp_path):
    """interop/tpu_check.py, tpu_probe.py and tpu_verify_probe.py run on a TPU host; here they say so in one line
    (exit 2), and the probe's own logic runs on the generic interpreter: the faithful kernel's tokens equal the
    reference's."""
    for mod in ("interop.tpu_check", "interop.tpu_probe", "interop.tpu_verify_probe"):
        p = subprocess.run([sys.executable, "-m", mod, "--out", str(tmp_path / "x")], capture_output=True, text=True)
        assert p.returncode == 2 and p.stderr.count("\n") == 1 and "TPU" in p.stderr, (mod, p.stderr)
    out = tmp_path / "probe.jsonl"
    p = subprocess.run([sys.executable, "-m", "interop.tpu_probe", "--interpret", "generic", "--model", "mini-llama",
                        "--dtype", "float32", "--out", str(out)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    row = json.loads(out.read_text())
    assert row["ok"] and row["tokens_equal"] and row["max_top1_logprob_delta"] < 1e-4, row


def test_tpu_check_passes_only_what_ran_and_passed():
    """interop.tpu_check's verdict: a step that ran nothing is not checked (never PASS), any failure FAILs."""
    from interop.tpu_check import verdict

    golden = {"golden_highest": {"models": {"mini-llama": {"verdict": "PASS"}}}}
    probe = {"probe": {"rows": [{"model": "mini-llama", "dtype": "float32", "ok": True}]}}
    diff = {"diff": {"mini-llama float32": {"verdict": "PASS"}}}
    assert verdict({**golden, **probe, **diff}) == ("PASS", [])
    assert verdict({**golden, **probe}) == ("INCONCLUSIVE", ["not checked: diff"])
    assert verdict({**golden, "probe": {"rows": []}, "diff": {}})[0] == "INCONCLUSIVE"  # nothing compiled: no PASS
    assert verdict({})[0] == "INCONCLUSIVE"
    bad = {**golden, **probe, "diff": {"mini-llama float32": {"verdict": "FAIL"}}}
    assert verdict(bad) == ("FAIL", ["diff mini-llama float32"])
    refused = {"probe": {"rows": [{"model": "m", "dtype": "bfloat16", "ok": False}]}}
    assert verdict({**golden, **diff, **refused})[0] == "FAIL"
    assert verdict({"golden_highest": {"models": {"error": "no JSON"}}, **probe, **diff})[0] == "FAIL"
