"""Where a declared bf16 recipe rounds the reference's parameters rather than its activations: the norm_weights
point (engines.recipe.ROUND_POINTS), each (1 + w) norm scale taken as bf(1 + w), as Muse Spark's kernel does."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from engines.config import Config

# The norms that scale by 1 + w in Gemma style (engines.reference.model.rms_norm's style): the layers' pre- and
# post-norms and QK norms; Muse's latent-MoE norms; the final norm where its own style is gemma.
GEMMA_NORMS = ("attn_norm", "mlp_norm", "q_norm", "k_norm", "post_attn_norm", "post_mlp_norm")
MUSE_MOE_NORMS = ("latent_norm", "expert_norm")


def norm_scales_rounded(p: dict, c: Config) -> dict:
    """p with each (1 + w) norm weight w replaced by bf(1 + w) - 1, so every norm that scales by 1 + w (in float32)
    scales by bf(1 + w). Both steps are exact in float32: bf(1 + w) has 8 significant bits, so its difference with 1
    and that difference plus 1 are representable for any weight a norm has."""
    if c.norm_style != "gemma":
        return p
    keys = GEMMA_NORMS + (MUSE_MOE_NORMS if c.moe_latent_style == "muse" else ()) \
        + (("final_norm",) if (c.final_norm_style or c.norm_style) == "gemma" else ())

    def rounded(w):  # reduce_precision: an astype pair XLA may elide as excess precision
        return jax.lax.reduce_precision(w.astype(jnp.float32) + 1.0, exponent_bits=8, mantissa_bits=7) - 1.0

    return {k: ([rounded(w) for w in v] if isinstance(v, list) else rounded(v)) if k in keys and k in p else v
            for k, v in p.items()}
