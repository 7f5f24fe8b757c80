"""The MoE layer of the reference (engines.reference.model): routed experts (every expert evaluated, weighted by the
route's sparse weights), DeepSeek's shared experts (Qwen3-Next's behind a sigmoid gate), gpt-oss's biased experts,
and the latent forms of Kimi K3 and Muse Spark. The routing itself (model.route) and every helper are model's own,
read at call time (model.f32 is float64 inside model.float64_math)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from engines.base import FREE_EXPERTS, OTHER_EXPERTS
from engines.config import Config
from engines.reference import model as M

# Muse Spark's post-expert norm eps (its config's post_eps, the same as its post-attention and post-FFN norms').
MOE_POST_EPS = 1e-8
FREE, OTHER = FREE_EXPERTS, OTHER_EXPERTS  # forced rows: the router's own choice, the other side of its near-tie


def moe(x: jax.Array, p: dict, m: int, c: Config, experts: jax.Array | None = None, rnd=None) -> jax.Array:
    """Routed experts (every expert evaluated, weighted by route's sparse weights) + shared expert.
    expert_act "gptoss": biased projections and gptoss_glu; "situ" (K3): situ for the experts and the shared expert.
    moe_latent (K3): the experts read x Wld and their weighted sum is normed and brought up by Wlu.
    experts [B, T, k]: the token's experts forced (a routing replay). rnd(x, "latent_moe"): a declared recipe's
    roundings of K3's latent path (each expert's gate and up and output, the shared expert's too, their weighted sum,
    the layer's output)."""
    rnd = rnd or (lambda v, point: v)
    gates = M.route(x, p["router"][m], p["router_bias"][m], c, experts)  # [B, T, E]
    # Operands widened to float32 after rounding to the weight dtype: exactly the products of bf16
    # inputs with float32 accumulation (XLA on CPU has no bf16 x bf16 -> float32 batched contraction).
    wd = p["e_gate"][m].dtype
    muse = c.moe_latent and c.moe_latent_style == "muse"
    xe = M.matmul(x, p["latent_down"][m]) if c.moe_latent else x  # K3, Muse: the experts work in the latent
    if muse:  # Muse: the latent normed before the experts
        xe = M.rms_norm(xe, p["latent_norm"][m], c.rms_eps, c.norm_style)
    x32 = M.rounded(xe, wd)
    g = rnd(jnp.einsum("btd,edf->btef", x32, p["e_gate"][m].astype(M.f32)), "latent_moe")
    u = rnd(jnp.einsum("btd,edf->btef", x32, p["e_up"][m].astype(M.f32)), "latent_moe")
    if c.expert_bias:
        g, u = g + p["e_gate_b"][m].astype(M.f32), u + p["e_up_b"][m].astype(M.f32)
    if c.expert_act == "gptoss":
        h = M.gptoss_glu(g, u, c.swiglu_alpha, c.swiglu_limit)
    else:
        h = M.situ(g, u) if c.expert_act == "situ" else jax.nn.silu(g) * u
    y = jnp.einsum("btef,efd->bted", M.rounded(h, wd), p["e_down"][m].astype(M.f32))
    if c.expert_bias:
        y = y + p["e_down_b"][m].astype(M.f32)
    y = rnd(y, "latent_moe")
    if muse:  # Muse: each expert's output times its norm weight, then normed (no weight) before the weighted sum
        w_post = p["expert_norm"][m].astype(M.f32) + (1.0 if c.norm_style == "gemma" else 0.0)
        y = M.rms_norm(y * w_post, None, MOE_POST_EPS)
    out = jnp.einsum("bte,bted->btd", gates, y)
    if muse:
        out = M.matmul(out, p["latent_up"][m])
    elif c.moe_latent:  # K3: normed over the latent's true width, then back up to the hidden size
        out = M.matmul(M.rms_norm(rnd(out, "latent_moe"), p["latent_norm"][m], c.rms_eps), p["latent_up"][m])
    if c.n_shared_experts:
        if c.expert_act == "situ":  # K3: rounded where a routed expert is (its projections, its output)
            g, u = (rnd(M.matmul(x, p[k][m]), "latent_moe") for k in ("s_gate", "s_up"))
            shared = rnd(M.matmul(M.situ(g, u), p["s_down"][m]), "latent_moe")
        else:
            shared = M.swiglu(x, p["s_gate"][m], p["s_up"][m], p["s_down"][m])
        if c.shared_expert_gate:  # Qwen3-Next: a sigmoid gate on the shared expert, one scalar a token
            shared = shared * jax.nn.sigmoid(M.matmul(x, p["shared_gate"][m][:, None]))
        out = out + shared
    return rnd(out, "latent_moe")


def forced_gap(x: jax.Array, router: jax.Array, bias: jax.Array, c: Config,
               idx: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(gap [...], experts [..., k]) for experts idx forced on the router (a routing replay): the largest choice
    score outside idx minus the smallest inside (<= 0 where idx is the top-k), so a replay tells the other side of
    a near-tie from a choice no rounding could make."""
    s = M.router_scores(x, router, bias, c)[1]
    idx = forced_choice(s, idx, c)
    inside = jnp.take_along_axis(s, idx, axis=-1).min(axis=-1)
    chosen = jax.nn.one_hot(idx, c.n_experts, dtype=M.f32).sum(axis=-2) > 0
    return jnp.where(chosen, -jnp.inf, s).max(axis=-1) - inside, jnp.sort(idx, axis=-1)


def forced_choice(choice: jax.Array, idx: jax.Array, c: Config) -> jax.Array:
    """idx [..., k] with its FREE and OTHER entries resolved against the choice scores [..., E]."""
    top = jax.lax.top_k(choice, min(c.top_k + 1, c.n_experts))[1]
    own = top[..., :c.top_k]
    other = jnp.concatenate([top[..., :c.top_k - 1], top[..., c.top_k:]], axis=-1) if c.top_k < c.n_experts else own
    return jnp.where(idx == FREE, own, jnp.where(idx == OTHER, other, idx))
