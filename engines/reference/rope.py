"""RoPE frequencies for each layer kind, with the scalings model configs declare (linear, llama3, YaRN).

Written from the published formulas (YaRN: Peng et al. 2023, "YaRN: Efficient Context Window Extension";
llama3: Meta's Llama 3.1 release), in numpy float32 as the frequencies are tables, not activations.
inv_freq returns (theta, inv_freq [hd/2] or None, attention_factor): the angle of pair i at position p is
p * inv_freq[i] (None: the plain theta^(-2i/hd), which model.rope_cos_sin computes itself, as it always
has), and YaRN multiplies cos and sin by attention_factor (so every q.k score by its square).
"""

from __future__ import annotations

import math

import numpy as np

from engines.config import Config

f32 = np.float32


def plain_inv_freq(head_dim: int, theta: float) -> np.ndarray:
    """theta^(-2i/hd) for i < hd/2, computed in float32 as the checkpoints' own code does."""
    return (f32(1.0) / (f32(theta) ** (np.arange(0, head_dim, 2, dtype=f32) / f32(head_dim)))).astype(f32)


def _yarn(inv: np.ndarray, hd: int, theta: float, s: dict) -> tuple[np.ndarray, float]:
    factor = float(s["factor"])
    original = float(s["original_max_position_embeddings"])
    beta_fast, beta_slow = float(s.get("beta_fast") or 32), float(s.get("beta_slow") or 1)
    mscale, mscale_all = s.get("mscale"), s.get("mscale_all_dim")

    def m(scale: float, k: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * k * math.log(scale) + 1.0

    attention = s.get("attention_factor")
    if attention is None:
        attention = m(factor, mscale) / m(factor, mscale_all) if mscale and mscale_all else m(factor)

    def dim_of(rotations: float) -> float:  # the pair index whose wavelength fits `rotations` times in original
        return hd * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_of(beta_fast), dim_of(beta_slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, hd - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(hd // 2, dtype=f32) - f32(low)) / f32(high - low), 0, 1).astype(f32)
    keep = f32(1) - ramp  # 1: the original frequency (high frequencies), 0: interpolated by factor
    return (inv / f32(factor) * (f32(1) - keep) + inv * keep).astype(f32), float(attention)


def _llama3(inv: np.ndarray, s: dict) -> np.ndarray:
    factor, low, high = float(s["factor"]), float(s["low_freq_factor"]), float(s["high_freq_factor"])
    original = float(s["original_max_position_embeddings"])
    wavelen = f32(2 * math.pi) / inv
    scaled = np.where(wavelen > original / low, inv / f32(factor), inv)  # long wavelengths: interpolated
    smooth = (original / wavelen - low) / (high - low)
    mid = (wavelen >= original / high) & (wavelen <= original / low)
    return np.where(mid, (1 - smooth) * scaled / factor + smooth * scaled, scaled).astype(f32)


def inv_freq(c: Config, kind: str) -> tuple[float, np.ndarray | None, float]:
    """The RoPE of a "full" or "sliding" layer. Sliding layers use rope_theta_local when set and are then
    never scaled (Gemma 3 scales only its global layers; gpt-oss declares one scaling for all layers)."""
    if kind == "sliding" and c.rope_theta_local:
        return c.rope_theta_local, None, 1.0
    s = dict(c.rope_scaling)
    kind_of = s.get("type")
    if not kind_of:
        return c.rope_theta, None, 1.0
    inv = plain_inv_freq(c.rope_dim, c.rope_theta)
    if kind_of == "linear":
        return c.rope_theta, (inv / f32(s["factor"])).astype(f32), 1.0
    if kind_of == "llama3":
        return c.rope_theta, _llama3(inv, s), 1.0
    return c.rope_theta, *_yarn(inv, c.rope_dim, c.rope_theta, s)
