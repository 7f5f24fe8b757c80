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
