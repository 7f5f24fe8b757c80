"""The residual stream between layers: the plain sum, Kimi K3's attention residuals, or Muse Spark's gated residual.

Attention residuals replace the running sum with a depth mixture. A row keeps the finished blocks (the sum of
each group of Config.attn_res_block layers' outputs, the first being the embedding) and the running prefix of the
current group. A layer's attention and MLP read M(w; n) = sum_i softmax_i(s_i) v_i over v = [blocks[:n], prefix],
s_i = (v_i . w) / rms(v_i) (w one learned vector per use: the loader's fold of the norm and projection weights);
their outputs add to the prefix; at the first layer of each group the prefix becomes a block and restarts at zero.
The final norm reads M(w_out; all blocks). Everything in float32, in one fixed order.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


class Plain:
    """x <- x + out (Gemma's post-norms applied to out first); what each layer reads is x itself."""

    def __init__(self, x, p: dict, c, post, round_res):
        self.x, self.p, self.c, self.post, self.round = x, p, c, post, round_res

    def attn_input(self, layer: int):
        return self.x

    def mlp_input(self, layer: int):
        return self.x

    def add_attn(self, layer: int, out) -> None:
        self.x = self.round(self.x + (self.post(out, self.p["post_attn_norm"][layer]) if self.c.post_norms else out))

    def add_mlp(self, layer: int, out) -> None:
        self.x = self.round(self.x + (self.post(out, self.p["post_mlp_norm"][layer]) if self.c.post_norms else out))

    def tap(self):
        return self.x

    def final(self):
        return self.x


class AttnRes:
    """Kimi K3's attention residuals (module docstring); block = Config.attn_res_block layers. rnd(x, "attn_res"):
    a declared recipe's rounding of each mixture's output (K3's kernel hands its norms a bf16 mixture)."""

    def __init__(self, x, p: dict, c, round_res, f32, rnd):
        self.p, self.c, self.round, self.f32, self.rnd = p, c, round_res, f32, rnd
        self.blocks: list = []
        self.prefix = x

    def mix(self, w, n: int):
        v = jnp.stack(self.blocks[:n] + [self.prefix])  # [n+1, B, T, D]
        score = jnp.einsum("nbtd,d->nbt", v, w.astype(self.f32)) * jax.lax.rsqrt(
            jnp.mean(v * v, axis=-1) + self.f32(self.c.rms_eps))
        return self.rnd(jnp.einsum("nbt,nbtd->btd", jax.nn.softmax(score, axis=0), v), "attn_res")

    def attn_input(self, layer: int):
        return self.mix(self.p["res_attn"][layer], (layer - 1) // self.c.attn_res_block + 1)

    def mlp_input(self, layer: int):
        return self.mix(self.p["res_mlp"][layer], layer // self.c.attn_res_block + 1)

    def add_attn(self, layer: int, out) -> None:
        if layer % self.c.attn_res_block == 0:  # a group starts: the prefix so far becomes a block
            self.blocks.append(self.prefix)
            self.prefix = jnp.zeros_like(self.prefix)
        self.prefix = self.round(self.prefix + out)

    def add_mlp(self, layer: int, out) -> None:
        self.prefix = self.round(self.prefix + out)

    def tap(self):
        return self.prefix

    def final(self):
        return self.mix(self.p["res_out"], len(self.blocks))


# Muse Spark's post-norms' eps (its config's post_eps); its pre-norms use rms_eps.
GATED_POST_EPS = 1e-8
# Muse's gate temperature and alpha's floor: beta = sigmoid(g / 0.3), alpha = sqrt(max(sigmoid(-g / 0.3) (1 + beta),
# 1e-3)).
GATE_TEMPERATURE, ALPHA_FLOOR = 0.3, 1e-3


class Gated:
    """Muse Spark's gated f32 residual: s <- alpha s + beta nb per channel, with u = g / 0.3, beta = sigmoid(u),
    alpha = sqrt(max(sigmoid(-u) (1 + beta), 1e-3)), g one learned vector per branch (res_gate_attn, res_gate_mlp).
    nb is the branch post-normed: the attention's by a weightless RMS norm, the MLP's as rms(out * w) with
    post_mlp_norm's w (1 + w in gemma style), both at eps GATED_POST_EPS. Each layer reads s itself."""

    def __init__(self, x, p: dict, c, rms_norm, round_res, f32):
        self.x, self.p, self.c, self.norm, self.round, self.f32 = x, p, c, rms_norm, round_res, f32

    def _gate(self, g, nb):
        u = g.astype(self.f32) / self.f32(GATE_TEMPERATURE)
        beta = jax.nn.sigmoid(u)
        alpha = jnp.sqrt(jnp.maximum(jax.nn.sigmoid(-u) * (1.0 + beta), self.f32(ALPHA_FLOOR)))
        self.x = self.round(alpha * self.x + beta * nb)

    def attn_input(self, layer: int):
        return self.x

    def mlp_input(self, layer: int):
        return self.x

    def add_attn(self, layer: int, out) -> None:
        self._gate(self.p["res_gate_attn"][layer], self.norm(out, None, GATED_POST_EPS))

    def add_mlp(self, layer: int, out) -> None:
        w = self.p["post_mlp_norm"][layer].astype(self.f32) + (1.0 if self.c.norm_style == "gemma" else 0.0)
        self._gate(self.p["res_gate_mlp"][layer], self.norm(out * w, None, GATED_POST_EPS))

    def tap(self):
        return self.x

    def final(self):
        return self.x
