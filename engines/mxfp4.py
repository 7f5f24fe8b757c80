"""MXFP4 (OCP Microscaling, FP4 E2M1 elements with a shared E8M0 scale per block of 32), as gpt-oss ships its
expert weights: dequantised on load to float32. Written from the OCP MX specification v1.0."""

from __future__ import annotations

import numpy as np

from engines.errors import ModelError

# E2M1: sign bit, 2 exponent bits, 1 mantissa bit; code 0..15
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)
SCALE_BIAS = 127  # E8M0: the scale is 2^(byte - 127)


def dequantize(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """blocks uint8 [..., out, G, 16] (two codes a byte, the first in the low nibble) and scales uint8
    [..., out, G] -> float32 [..., G*32, out]: the (in, out) layout of engines.weights."""
    if blocks.dtype != np.uint8 or scales.dtype != np.uint8 or blocks.shape[:-1] != scales.shape \
            or blocks.shape[-1] != 16:
        raise ModelError(f"malformed MXFP4 tensor: blocks {blocks.dtype}{list(blocks.shape)}, "
                         f"scales {scales.dtype}{list(scales.shape)}")
    codes = np.empty(blocks.shape[:-1] + (32,), np.uint8)
    codes[..., 0::2] = blocks & 0x0F
    codes[..., 1::2] = blocks >> 4
    values = E2M1[codes] * np.exp2(scales.astype(np.float32) - SCALE_BIAS)[..., None]
    out = values.reshape(values.shape[:-2] + (-1,))  # [..., out, in]
    return np.ascontiguousarray(np.swapaxes(out, -1, -2))


# Scale bytes a checkpoint may not hold (Kimi K3's loader refuses them): 0 (2^-127, below any real weight block) and
# 255 (NaN in E8M0).
INVALID_SCALES = (0, 255)


def dequantize_packed(packed: np.ndarray, scales: np.ndarray, name: str = "tensor") -> np.ndarray:
    """The compressed-tensors layout Kimi K3's experts ship in: packed uint8 [..., N, K/2] (two codes a byte, the
    lower K index in the low nibble) and scales uint8 [..., N, K/32] (one E8M0 byte per 32 consecutive contraction
    elements of an output row) -> float32 [..., N, K], the checkpoint's own (out, in) layout. Exact: every value is
    a code's E2M1 value times a power of two. A scale byte of 0 or 255 is refused, naming the tensor."""
    if packed.dtype != np.uint8 or scales.dtype != np.uint8 or packed.shape[:-1] != scales.shape[:-1] \
            or packed.shape[-1] != 16 * scales.shape[-1]:
        raise ModelError(f"malformed MXFP4 {name}: weight_packed {packed.dtype}{list(packed.shape)}, "
                         f"weight_scale {scales.dtype}{list(scales.shape)} (expected uint8 [N, K/2] and [N, K/32])")
    bad = np.isin(scales, INVALID_SCALES)
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ModelError(f"invalid MXFP4 scale byte {int(scales[at])} in {name} at {list(at)} "
                         f"(E8M0 bytes {INVALID_SCALES[0]} and {INVALID_SCALES[1]} are refused)")
    blocks = packed.reshape(packed.shape[:-1] + (scales.shape[-1], 16))
    return np.ascontiguousarray(np.swapaxes(dequantize(blocks, scales), -1, -2))  # [..., N, K]
