"""The linear-attention layers in the megakernel: Gated DeltaNet (Qwen3-Next / Qwen3.8) and Kimi Delta Attention
(Kimi Linear / K3). The engine's own math for one token a row, used by the decode kernel on a layer's VMEM buffers
and by the XLA prefill's scan (engines/reference/gdn.py and kda.py are the independent ones the judge runs).

A layer's arrays as the engine places them (spec.recurrent_arrays), P the kind's prefix ("gdn" or "kda"):
P_qkv [D, C] (q | k | v columns fused), P_conv [taps, C] (tap taps-1 the current token), P_out [Hv*dv, D], P_norm
[1, dv] (a plain weight), P_A_log [1, Hv]. GDN: gdn_z [D, Hv*dv], gdn_ba [D, 2*Hv] (b | a), gdn_dt_bias [1, Hv].
KDA (H heads of d, keys and values alike): kda_b [D, H], the forget gate's kda_fa [D, rf], kda_fb [rf, H*d],
kda_dt_bias [1, H*d], the output gate's kda_ga [D, rg], kda_gb [rg, H*d] (or K3's one kda_g [D, H*d]). The state,
float32: hist [B, taps-1, C] (the last raw projections, oldest first; channels in lanes) and S [B, Hv, dk, dv].
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from engines.config import Config
from engines.megakernel import ops

F32 = jnp.float32
# Inside the sum of squares, as Qwen3-Next's and flash-linear-attention's l2norm put it: the model's constant, not
# a tolerance (the l2_eps_outside fault moves it).
L2_EPS = 1e-6
RECURRENT_KINDS = ("gdn", "kda")  # in the order their state stacks follow the KV cache in the engine's state
GDN_KEYS = ("gdn_qkv", "gdn_z", "gdn_ba", "gdn_conv", "gdn_A_log", "gdn_dt_bias", "gdn_norm", "gdn_out")


def kda_keys(c: Config) -> tuple[str, ...]:
    """A KDA layer's arrays in the engine's layout (its output gate low-rank, or K3's one projection)."""
    return ("kda_qkv", "kda_conv", "kda_b", "kda_fa", "kda_fb", "kda_dt_bias", "kda_A_log", "kda_norm", "kda_out") \
        + (("kda_ga", "kda_gb") if c.kda_out_rank else ("kda_g",))


def keys(c: Config, kind: str) -> tuple[str, ...]:
    return GDN_KEYS if kind == "gdn" else kda_keys(c)


def dims(c: Config, kind: str) -> tuple[int, int, int, int, int]:
    """(key heads, value heads, key dim, value dim, conv taps) of a recurrent kind."""
    if kind == "gdn":
        return c.gdn_k_heads, c.gdn_v_heads, c.gdn_k_dim, c.gdn_v_dim, c.gdn_conv
    return c.kda_heads, c.kda_heads, c.kda_dim, c.kda_dim, c.kda_conv


def shapes(c: Config, kind: str) -> dict[str, tuple[int, ...]]:
    """One layer's arrays of a recurrent kind as the kernel streams them (vectors as one row)."""
    D = c.hidden
    Hk, Hv, dk, dv, taps = dims(c, kind)
    C = 2 * Hk * dk + Hv * dv
    out = {f"{kind}_qkv": (D, C), f"{kind}_conv": (taps, C), f"{kind}_A_log": (1, Hv), f"{kind}_norm": (1, dv),
           f"{kind}_out": (Hv * dv, D)}
    if kind == "gdn":
        return out | {"gdn_z": (D, Hv * dv), "gdn_ba": (D, 2 * Hv), "gdn_dt_bias": (1, Hv)}
    Hd, rf, rg = Hv * dv, c.kda_gate_rank, c.kda_out_rank
    out |= {"kda_b": (D, Hv), "kda_fa": (D, rf), "kda_fb": (rf, Hd), "kda_dt_bias": (1, Hd)}
    return out | ({"kda_ga": (D, rg), "kda_gb": (rg, Hd)} if rg else {"kda_g": (D, Hd)})


def l2norm(x: jax.Array, eps_outside: bool = False) -> jax.Array:
    """x / sqrt(sum(x^2) + eps) over the last axis (eps_outside: the fault's x / (sqrt(sum(x^2)) + eps))."""
    ss = jnp.sum(x * x, axis=-1, keepdims=True)
    return x / (jnp.sqrt(ss) + L2_EPS) if eps_outside else x * jax.lax.rsqrt(ss + L2_EPS)


def project(c: Config, kind: str, h: jax.Array, w: dict, rounds: tuple[str, ...] = ()):
    """A layer's projections of normed inputs h [N, D]: raw q|k|v [N, C], the output gate's input [N, Hv*dv] (GDN's
    z, KDA's gate logits) and the state's gates (beta [N, Hv], the log decay: GDN [N, Hv], KDA [N, Hv, dk])."""
    Hk, Hv, dk, dv, _ = dims(c, kind)
    rd = ops.rounder(rounds)
    proj = lambda x, key: rd(ops.mm(x, w[key]), "projections")  # noqa: E731
    mixed = proj(h, f"{kind}_qkv")
    rate = jnp.exp(w[f"{kind}_A_log"])  # [1, Hv]
    if kind == "gdn":
        ba = proj(h, "gdn_ba")
        g = -rate * jax.nn.softplus(ba[:, Hv:] + w["gdn_dt_bias"])  # one decay per value head
        return mixed, proj(h, "gdn_z"), rd(jax.nn.sigmoid(ba[:, :Hv]), "beta"), g
    f = (proj(ops.mm(h, w["kda_fa"]), "kda_fb") + w["kda_dt_bias"]).reshape(-1, Hv, dk)
    rate = rate.reshape(1, Hv, 1)
    # one decay per key channel: Kimi K3's bounded below by -kda_gate_bound, Kimi Linear's softplus
    g = -F32(c.kda_gate_bound) * jax.nn.sigmoid(rate * f) if c.kda_gate_bound else -rate * jax.nn.softplus(f)
    gate = proj(ops.mm(h, w["kda_ga"]), "kda_gb") if c.kda_out_rank else proj(h, "kda_g")
    return mixed, gate, rd(jax.nn.sigmoid(proj(h, "kda_b")), "beta"), g


def step(c: Config, kind: str, w: dict, mixed, beta, g, hist, S, kn, rounds: tuple[str, ...] = ()):
    """One token a row: mixed [B, C] raw projections, beta [B, Hv], g the log decay ([B, Hv] or [B, Hv, dk]), hist
    [B, taps-1, C], S [B, Hv, dk, dv] (float32). Returns o [B, Hv, dv] (before the output norm), the new hist and
    the new S. kn: the fault's knobs; rounds: the recipe's rounding points."""
    B = mixed.shape[0]
    Hk, Hv, dk, dv, _ = dims(c, kind)
    win = jnp.concatenate([hist, mixed[:, None, :]], axis=1)  # [B, taps, C]: oldest first, this token last
    conv = jnp.sum(win * w[f"{kind}_conv"].astype(F32)[None], axis=1)  # the depthwise causal conv
    act = ops.rounder(rounds)(jax.nn.silu(conv), "conv")
    new_hist = hist if kn.conv_unshifted else win[:, 1:]
    r = Hv // Hk  # key head j serves value heads j*r .. j*r+r-1

    def heads(x):  # [B, Hk*dk] -> normed, each key head repeated onto its r value heads: [B*Hv, dk]
        x = l2norm(ops.reshape(x, B * Hk, dk), kn.l2_eps_outside)
        return jnp.repeat(x, r, axis=0) if r > 1 else x

    q = heads(act[:, :Hk * dk]) * F32(dk ** -0.5)
    k = heads(act[:, Hk * dk:2 * Hk * dk])
    v = ops.reshape(act[:, 2 * Hk * dk:], B * Hv, dv)
    beta = ops.reshape(beta, B * Hv, 1)
    if kn.kda_gate_per_head and g.ndim == 3:  # the fault: a head's first channel's decay for all of them
        g = jnp.broadcast_to(g[:, :, :1], g.shape)
    decay = ops.reshape(jnp.exp(g), B * Hv, -1, 1)  # [N, 1, 1] a head's, or [N, dk, 1] a key channel's
    S = S.reshape(B * Hv, dk, dv)

    def read(x, S):  # x^T S per head, [N, dk] -> [N, dv]: a batched matmul with f32 accumulation, as the MXU does
        return jnp.einsum("nqk,nkv->nqv", x[:, None, :], S, preferred_element_type=F32,
                          precision=ops.precision(F32))[:, 0]

    if kn.decay_after_delta:  # the delta rule reads the undecayed memory, and the decay lands on the update too
        S = (S + k[:, :, None] * (beta * (v - read(k, S)))[:, None, :]) * decay
    else:
        S = S * decay
        S = S + k[:, :, None] * (beta * (v - read(k, S)))[:, None, :]
    return read(q, S).reshape(B, Hv, dv), new_hist, S.reshape(B, Hv, dk, dv)


def finish(c: Config, kind: str, w: dict, o, gate, eps: float, rounds: tuple[str, ...] = ()) -> jax.Array:
    """o [N, Hv, dv], gate [N, Hv*dv] -> the layer's output [N, D]: RMSNorm over each head's dv with the plain
    weight, times silu(z) (GDN) or sigmoid(gate) (KDA), through out."""
    N, Hv, dv = o.shape
    rd = ops.rounder(rounds)
    o = rd(ops.reshape(ops.rmsnorm(o.reshape(N * Hv, dv), w[f"{kind}_norm"], eps), N, Hv * dv), "out_gate")
    act = rd(jax.nn.silu(gate) if kind == "gdn" else jax.nn.sigmoid(gate), "out_gate")
    return ops.mm(rd(o * act, "out_gate"), w[f"{kind}_out"])


def layer(c: Config, kind: str, w: dict, h, hist, S, kn, eps: float, rounds: tuple[str, ...] = ()):
    """A decode step's recurrent layer on h [B, D]: (out [B, D], hist, S). rounds: the recipe's rounding points."""
    mixed, gate, beta, g = project(c, kind, h, w, rounds)
    o, hist, S = step(c, kind, w, mixed, beta, g, hist, S, kn, rounds)
    return finish(c, kind, w, o, gate, eps, rounds), hist, S


def block(c: Config, kind: str, w: dict, h, hist, S, kn, eps: float, T: int, rounds: tuple[str, ...] = ()):
    """A verify step's recurrent layer on h [B*T, D] (row b*T + t: cache row b's block token t), the tokens of a
    row in order: (out [B*T, D], hist and S after each token [T, B, ...]: the snapshots a rollback restores)."""
    outs, hs, ss = [], [], []
    for t in range(T):
        out, hist, S = layer(c, kind, w, ops.rows_of(h, t, T), hist, S, kn, eps, rounds)
        outs.append(out)
        hs.append(hist)
        ss.append(S)
    return ops.interleave(outs), jnp.stack(hs), jnp.stack(ss)


def prefill(c: Config, kind: str, w: dict, h, hist, S, valid, eps: float, rounds: tuple[str, ...] = ()):
    """A prefill's recurrent layer on h [B, T, D] from state (hist, S) [B, ...]; valid [B, T]: a row's state moves
    only over its real tokens. Returns (out [B, T, D], hist, S). Never faulted (the prefill is XLA, as on a TPU)."""
    from engines.megakernel.faults import Knobs

    B, T, D = h.shape
    mixed, gate, beta, g = project(c, kind, h.reshape(B * T, D), w, rounds)

    def tok(carry, xs):
        hist, S = carry
        m, b, gt, ok = xs
        o, h1, S1 = step(c, kind, w, m, b, gt, hist, S, Knobs(), rounds)
        return (jnp.where(ok[:, None, None], h1, hist), jnp.where(ok[:, None, None, None], S1, S)), o

    xs = tuple(a.reshape(B, T, *a.shape[1:]).swapaxes(0, 1) for a in (mixed, beta, g)) + (valid.T,)
    (hist, S), o = jax.lax.scan(tok, (hist, S), xs)
    _, Hv, _, dv, _ = dims(c, kind)
    out = finish(c, kind, w, o.swapaxes(0, 1).reshape(B * T, Hv, dv), gate, eps, rounds)
    return out.reshape(B, T, D), hist, S


def state_shapes(c: Config, kind: str, batch: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A recurrent kind's state stacks in HBM: hist [n, B, taps-1, C] and S [n, B, Hv, dk, dv] (n: its layers)."""
    Hk, Hv, dk, dv, taps = dims(c, kind)
    n = sum(k == kind for k in c.layer_kinds)
    return (n, batch, taps - 1, 2 * Hk * dk + Hv * dv), (n, batch, Hv, dk, dv)


def state(c: Config, batch: int) -> list[tuple[int, ...]]:
    """The engine's recurrent state stacks after the KV cache: (hist, S) of each recurrent kind the model has."""
    return [s for kind in kinds(c) for s in state_shapes(c, kind, batch)]


def kinds(c: Config) -> tuple[str, ...]:
    return tuple(k for k in RECURRENT_KINDS if k in c.layer_kinds)
