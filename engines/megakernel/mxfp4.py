"""Routed experts kept in MXFP4 in HBM and dequantised in VMEM (the format gpt-oss and Kimi K3 ship their experts in).

The megakernel's own layout, not the checkpoint's: an expert matrix [in, out] is stored as codes packed two a byte,
row i in the low nibble and row i + in/2 in the high one ([in/2, out] uint8, so unpacking is two nibble masks and a
sublane concatenation), and one E8M0 scale byte per 32 rows of a column ([in/32, out] uint8). The placement encodes
the engine's float32 expert weights back into MXFP4 and refuses, in one line, weights that MXFP4 cannot hold exactly;
weights that came from an MXFP4 checkpoint always can, so the dequantised matrix is bitwise the one the dense path
multiplies (in float32 and in bfloat16: an E2M1 value times a power of two has one mantissa bit).
Written from the OCP Microscaling specification v1.0 (E2M1 elements, E8M0 scales, blocks of 32).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

BLOCK = 32  # values sharing one scale
SCALE_BIAS = 127  # E8M0: 2^(byte - 127)
# E2M1 magnitudes by their 3-bit code (exponent 2 bits, mantissa 1): the sign is the code's fourth bit
MAGNITUDES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
MATRICES = ("e_gate", "e_up", "e_down")


def encode(w: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """w [..., in, out] float -> (codes [..., in/2, out] uint8, scales [..., in/32, out] uint8), exact or a ValueError.
    Each block's scale is the one that puts its largest magnitude in [4, 8): the only choice whose codes can reach it,
    and one that holds every smaller value of the block when any scale does."""
    w = np.asarray(w, np.float64)
    n = w.shape[-2]
    if n % (2 * BLOCK):
        raise ValueError(f"{name}: {n} input rows, not a multiple of {2 * BLOCK} (MXFP4 blocks of {BLOCK}, two a byte)")
    blocks = w.reshape(*w.shape[:-2], n // BLOCK, BLOCK, w.shape[-1])
    amax = np.abs(blocks).max(axis=-2, keepdims=True)
    exp = np.where(amax > 0, np.floor(np.log2(np.where(amax > 0, amax, 1.0))) - 2, 0.0)
    q = blocks / np.exp2(exp)
    mag = np.abs(q)
    code = np.argmin(np.abs(mag[..., None] - MAGNITUDES), axis=-1)
    if not np.array_equal(MAGNITUDES[code], mag) or (exp + SCALE_BIAS).min() < 1 or (exp + SCALE_BIAS).max() > 254:
        raise ValueError(f"{name}: weights MXFP4 cannot hold exactly (not from an MXFP4 checkpoint); use "
                         f"--engine-option experts=dense")
    code = (code + np.where(q < 0, 8, 0)).astype(np.uint8).reshape(w.shape)
    half = n // 2
    packed = code[..., :half, :] | (code[..., half:, :] << 4)
    return packed.astype(np.uint8), (exp[..., 0, :] + SCALE_BIAS).astype(np.uint8)


def decode(codes: jax.Array, scales: jax.Array, dtype, nibbles_swapped: bool = False) -> jax.Array:
    """[in/2, out] codes and [in/32, out] scales (uint8) -> [in, out] in dtype: each 4-bit code's E2M1 value (sign bit
    3, exponent bits 1-2, mantissa bit 0: exponent 0 is the subnormal m/2, else (1 + m/2) 2^(e-1)) times its block's
    2^(scale - 127) (scale bytes 1..254: normal powers of two, made by their bits). nibbles_swapped: the high nibble
    read as the first row (the mxfp4_nibbles fault)."""
    c = codes.astype(jnp.int32)
    lo, hi = c & 15, c >> 4
    c = jnp.concatenate([hi, lo] if nibbles_swapped else [lo, hi], axis=0)  # [in, out]
    e, m = (c >> 1) & 3, (c & 1).astype(jnp.float32)
    mag = jnp.where(e == 0, 0.5 * m, (1.0 + 0.5 * m) * jnp.where(e == 1, 1.0, jnp.where(e == 2, 2.0, 4.0)))
    val = jnp.where(c >= 8, -mag, mag)
    nb, out = scales.shape
    scale = jax.lax.bitcast_convert_type(scales.astype(jnp.int32) << 23, jnp.float32)  # exactly 2^(s - 127)
    scale = jnp.broadcast_to(scale[:, None, :], (nb, BLOCK, out)).reshape(nb * BLOCK, out)
    return (val * scale).astype(dtype)


def dense_expert(e: dict, dtype, nibbles_swapped: bool = False) -> dict:
    """An expert's arrays with its MXFP4 matrices (KEY_q codes, KEY_s scales) decoded to KEY in dtype."""
    out = {k: v for k, v in e.items() if not k.endswith(("_q", "_s"))}
    for k in MATRICES:
        if f"{k}_q" in e:
            out[k] = decode(e[f"{k}_q"], e[f"{k}_s"], dtype, nibbles_swapped)
    return out
