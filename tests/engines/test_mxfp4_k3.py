"""Kimi K3's MXFP4 expert layout (ARCHITECTURES.md 1.3): weight_packed [N, K/2] uint8 with the lower K index in the
low nibble, weight_scale [N, K/32] uint8 E8M0, 0 and 255 refused; and a Kimi checkpoint whose experts are stored
so loads them exactly. The expected values come from a decoder written here bit by bit, not from engines.mxfp4."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engines.errors import ModelError
from engines.hf_loader import load_hf
from engines.mxfp4 import dequantize_packed
from evalsuite.models import minis_dir


def decode(code: int, scale: int) -> float:
    """E2M1 by its bits: bit 3 the sign, bits 0-2 index the magnitudes; times 2^(scale - 127)."""
    magnitude = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0][code & 7]
    return (-magnitude if code & 8 else magnitude) * 2.0 ** (scale - 127)


def pack(codes: np.ndarray) -> np.ndarray:
    """codes [N, K] in 0..15 -> [N, K/2] bytes, index 2i in the low nibble, 2i+1 in the high."""
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)


def test_all_sixteen_codes_at_scales_127_and_128_are_exact():
    codes = np.tile(np.arange(16), (2, 2))  # [2, 32]: every code twice a row
    scales = np.array([[127], [128]], np.uint8)
    got = dequantize_packed(pack(codes), scales)
    want = np.array([[decode(int(c), int(s[0])) for c in row] for row, s in zip(codes, scales)], np.float32)
    assert np.array_equal(got, want) and np.array_equal(np.signbit(got), np.signbit(want))  # -0.0 for code 8


def test_the_low_nibble_holds_the_lower_index():
    packed = np.zeros((1, 16), np.uint8)
    packed[0, 0] = 0x21  # index 0: code 1 (0.5); index 1: code 2 (1.0)
    got = dequantize_packed(packed, np.full((1, 1), 127, np.uint8))
    assert got[0, 0] == 0.5 and got[0, 1] == 1.0


@pytest.mark.parametrize("byte", [0, 255])
def test_invalid_scale_bytes_are_one_line_errors(byte):
    scales = np.full((2, 2), 127, np.uint8)
    scales[1, 1] = byte
    with pytest.raises(ModelError, match=f"invalid MXFP4 scale byte {byte} in w2 at \\[1, 1\\]") as e:
        dequantize_packed(np.zeros((2, 32), np.uint8), scales, name="w2")
    assert "\n" not in str(e.value)


def test_a_malformed_layout_is_refused():
    with pytest.raises(ModelError, match="malformed MXFP4"):
        dequantize_packed(np.zeros((2, 31), np.uint8), np.full((2, 2), 127, np.uint8))


def quantize(w: np.ndarray, rng) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """w [N, K] float -> (packed, scales, the values they hold by decode()): the nearest code per element under a
    per-block scale of 2^floor(log2(max|w| / 6)) (clipped into the valid bytes)."""
    N, K = w.shape
    blocks = w.reshape(N, K // 32, 32)
    e = np.clip(np.floor(np.log2(np.abs(blocks).max(-1) / 6.0 + 1e-30)) + 127, 1, 254).astype(np.uint8)
    table = np.array([decode(c, 127) for c in range(16)])
    scaled = blocks / np.exp2(e.astype(np.float64) - 127)[..., None]
    codes = np.abs(scaled[..., None] - table).argmin(-1).reshape(N, K)
    values = np.array([[decode(int(c), int(e[n, k // 32])) for k, c in enumerate(row)] for n, row in enumerate(codes)])
    return pack(codes), e, values.astype(np.float32)


def test_a_kimi_checkpoint_with_mxfp4_experts_loads_them_exactly(tmp_path):
    """mini-kimi-linear in the released layout with every expert matrix as weight_packed + weight_scale (and the
    compressed-tensors quantization_config): the loaded experts are the decoded values exactly; everything else is
    the unquantised checkpoint's. A scale byte of 255 in one expert is refused in one line."""
    from safetensors.numpy import load_file, save_file

    from tests.engines.reference.test_kimi import original_layout_tensors

    src = minis_dir() / "mini-kimi-linear"
    plain = original_layout_tensors(load_file(str(src / "model.safetensors")))
    rng = np.random.default_rng(0)
    out, want = {}, {}
    for k, v in plain.items():
        if ".experts." in k and k.endswith(".weight"):
            packed, scales, values = quantize(v, rng)
            out[k[:-len("weight")] + "weight_packed"], out[k[:-len("weight")] + "weight_scale"] = packed, scales
            want[k] = values
        else:
            out[k] = v
    cfg = {**json.loads((src / "config.json").read_text()), "quantization_config": {"quant_method":
                                                                                   "compressed-tensors"}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    save_file(out, str(tmp_path / "model.safetensors"))
    w = load_hf(tmp_path, "kimi-mxfp4")
    c = w.config
    for m in range(c.n_moe_layers):
        layer = c.n_dense_layers + m
        for e in range(c.n_experts):
            stem = f"model.layers.{layer}.block_sparse_moe.experts.{e}."
            assert np.array_equal(w.arrays["e_gate"][m, e], want[stem + "w1.weight"].T)
            assert np.array_equal(w.arrays["e_up"][m, e], want[stem + "w3.weight"].T)
            assert np.array_equal(w.arrays["e_down"][m, e], want[stem + "w2.weight"].T)
    dense = load_hf(src, "mini-kimi-linear")
    assert all(np.array_equal(w.arrays[k], dense.arrays[k]) for k in w.arrays if not k.startswith("e_"))
    bad = dict(out)
    key = next(k for k in bad if k.endswith("w2.weight_scale"))
    bad[key] = bad[key].copy()
    bad[key][0, 0] = 255
    save_file(bad, str(tmp_path / "model.safetensors"))
    with pytest.raises(ModelError, match="invalid MXFP4 scale byte 255") as err:
        load_hf(tmp_path, "kimi-mxfp4")
    assert "w2.weight" in str(err.value) and "\n" not in str(err.value)
