"""A MoE layer's math around its routed experts, the kernel's and the XLA prefill's one code: the router, and the
latent forms: Kimi K3's, whose
experts read x W_ld and whose weighted sum is normed over the latent's true width and brought up by W_lu, and Muse
Spark's, whose experts read rms(x W_ld) w and each expert's output is scaled by the layer's expert_norm and normed
(no weight) before the weighted sum, brought up by W_lu. get(key) reads one of the MoE layer's arrays."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from engines.config import Config
from engines.megakernel import ops
from engines.megakernel.faults import Knobs

FAITHFUL = Knobs()


def route(c: Config, h: jax.Array, get, kn: Knobs = FAITHFUL) -> jax.Array:
    """The router's dense gate weights [N, E] for normed inputs h [N, D] (kn: a fault's knobs; the prefill's are
    the faithful ones)."""
    return ops.pick_experts(ops.mm(h, get("router")), get("router_bias"), router=c.router, top_k=c.top_k,
                            norm_topk=c.norm_topk and not kn.moe_unnormalized, scale=c.routed_scale,
                            skip_first=kn.router_skip_first, bias_in_weights=kn.router_bias_in_weights,
                            logit_scale=c.router_logit_scale, eps=c.router_eps)


def muse(c: Config) -> bool:
    return bool(c.moe_latent) and c.moe_latent_style == "muse"


def down(c: Config, h: jax.Array, get, eps: float) -> jax.Array:
    """What the routed experts read: h itself, or its latent (Muse: normed)."""
    if not c.moe_latent:
        return h
    xe = ops.mm(h, get("latent_down"))
    return ops.rmsnorm(xe, get("latent_norm"), eps) if muse(c) else xe


def expert_out(c: Config, y: jax.Array, get) -> jax.Array:
    """One routed expert's output as it enters the weighted sum (Muse: scaled, then normed)."""
    return ops.rmsnorm(y * get("expert_norm"), None, ops.MUSE_POST_EPS) if muse(c) else y


def up(c: Config, y: jax.Array, get, eps: float, width: int = 0, rounded: bool = False) -> jax.Array:
    """The experts' weighted sum back at the hidden size (K3: normed first, over `width` where the
    latent_norm_padded fault gives one; rounded: the sum rounded to bf16 first, the recipe's latent_moe point)."""
    if not c.moe_latent:
        return y
    if muse(c):
        return ops.mm(y, get("latent_up"))
    return ops.mm(ops.rmsnorm(ops.round_to(y, jnp.bfloat16) if rounded else y, get("latent_norm"), eps, width),
                  get("latent_up"))
