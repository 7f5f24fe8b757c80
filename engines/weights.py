"""The weights container shared by every engine, and the seeded random weights of the mini models.

Layout (float32 numpy, matrices stored (in, out) so activations multiply on the left):

    embed        [V, D]            lm_head     [V, D]  (absent when tied to embed)
    final_norm   [D]
    attn_norm    [L, D]            mlp_norm    [L, D]
    wq [La, D, H*hd]   wk, wv [La, D, K*hd]   wo [La, H*hd, D]
    q_norm, k_norm [La, hd]        (Config.qk_norm only)
    wg [La, D, H*hd]               (Config.attn_out_gate: the per-head output gate)
    gate, up [Ld, D, F]   down [Ld, F, D]                       dense MLP layers
    router [Lm, D, E]   router_bias [Lm, E]                      MoE layers
    e_gate, e_up [Lm, E, D, Fm]   e_down [Lm, E, Fm, D]
    s_gate, s_up [Lm, D, Fs]      s_down [Lm, Fs, D]             (n_shared_experts > 0)
    shared_gate [Lm, D]                                          (Config.shared_expert_gate: Qwen3-Next)
    res_attn, res_mlp [L, D]   res_out [D]          (Config.attn_res_block: the depth mixtures' vectors, K3)
    res_gate_attn, res_gate_mlp [L, D]   post_mlp_norm [L, D]   (Config.residual_gates: Muse's gated residual)
    expert_norm [Lm, De]                        (Config.moe_latent_style "muse": each expert's output norm)
    latent_down [Lm, D, De]   latent_norm [Lm, De]   latent_up [Lm, De, D]   (Config.moe_latent = De: the experts'
                                                                  e_gate, e_up [Lm, E, De, Fm], e_down [.., Fm, De])
    bq [La, H*hd]   bk, bv [La, K*hd]                            (Config.attn_bias)
    bo [La, D]                                                   (Config.o_bias)
    post_attn_norm, post_mlp_norm [L, D]                         (Config.post_norms; mlp_norm is the pre-MLP one)
    sinks [La, H]                                                (Config.attn_sinks)
    gdn_q, gdn_k [Lg, D, Hk*dk]   gdn_v, gdn_z [Lg, D, Hv*dv]   gdn_b, gdn_a [Lg, D, Hv]     Gated DeltaNet layers
    gdn_conv [Lg, C, taps]   gdn_A_log, gdn_dt_bias [Lg, Hv]   gdn_norm [Lg, dv]   gdn_out [Lg, Hv*dv, D]
    kda_q, kda_k, kda_v [Lk, D, H*d]   kda_conv [Lk, 3*H*d, taps]   kda_fa [Lk, D, rf]   kda_fb [Lk, rf, H*d]
    kda_dt_bias [Lk, H*d]   kda_A_log [Lk, H]   kda_b [Lk, D, H]   kda_ga [Lk, D, rg]   kda_gb [Lk, rg, H*d]
    kda_norm [Lk, d]   kda_out [Lk, H*d, D]                                                Kimi Delta Attention layers
    kda_g [Lk, D, H*d] in place of kda_ga, kda_gb                                   (Config.kda_out_rank 0: K3)
    mla_q [Lx, D, H*(n+r)] (or mla_qa [Lx, D, rq], mla_q_norm [Lx, rq], mla_qb [Lx, rq, H*(n+r)])
    mla_kva [Lx, D, rk+r]
    mla_kv_norm [Lx, rk]   mla_kvb [Lx, rk, H*(n+v)]   mla_o [Lx, H*v, D]                  multi-head latent attention
    mla_g [Lx, D, H*v]                                                                   (Config.mla_out_gate: K3)
    e_gate_b, e_up_b [Lm, E, Fm]   e_down_b [Lm, E, D]           (Config.expert_bias)

Ld = Config.n_dense_layers (the first layers), Lm = Config.n_moe_layers (the rest); La = the attention layers
(Config.attn_layers: all of them but the Gated DeltaNet layers), Lg = the GDN layers (Config.gdn_layers);
C = Config.gdn_conv_dim (the q, k and v channels, in that order), taps = Config.gdn_conv.
Q and K columns follow Config.rope_style: a GGUF file keeps llama.cpp's interleaved order.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from engines.config import MINI_KIMI, MINI_LLAMA, MINI_MOE, MINI_MUSE, Config
from engines.errors import ModelError
from engines.lazy import LazyArrays


@dataclass(frozen=True)
class Weights:
    """Config + named float32 arrays + provenance (sha256 of the source file(s))."""

    config: Config
    arrays: dict[str, np.ndarray] = field(repr=False)
    sha256: str
    source: str

    def __post_init__(self) -> None:
        expected = expected_shapes(self.config)
        missing = sorted(set(expected) - set(self.arrays))
        extra = sorted(set(self.arrays) - set(expected))
        if missing or extra:
            raise ValueError(f"weights for {self.config.name}: missing {missing}, unexpected {extra}")
        for name, shape in expected.items():
            if self.shape(name) != shape:
                raise ValueError(
                    f"weights for {self.config.name}: {name} has shape {self.shape(name)}, expected {shape}")

    def shape(self, name: str) -> tuple[int, ...]:
        """An array's shape, without reading it when the arrays are lazy (engines.lazy.LazyArrays)."""
        return self.arrays.shape(name) if isinstance(self.arrays, LazyArrays) else self.arrays[name].shape

    @property
    def lazy(self) -> bool:
        """True: arrays are read from the files on demand (engines.lazy), whole only when indexed by name."""
        return isinstance(self.arrays, LazyArrays)

    @property
    def n_params(self) -> int:
        return int(sum(int(np.prod(self.shape(k))) for k in self.arrays))

    @property
    def nbytes(self) -> int:
        return 4 * self.n_params if self.lazy else int(sum(a.nbytes for a in self.arrays.values()))


def expected_shapes(c: Config) -> dict[str, tuple[int, ...]]:
    """Every array name of a Config and its shape (see the module docstring)."""
    L, D, hd, La = c.n_layers, c.hidden, c.head_dim, len(c.attn_layers)
    s: dict[str, tuple[int, ...]] = {"embed": (c.vocab_size, D), "final_norm": (D,), "attn_norm": (L, D),
                                     "mlp_norm": (L, D)}
    if La:
        s.update(wq=(La, D, c.q_size), wk=(La, D, c.kv_size), wv=(La, D, c.kv_size), wo=(La, c.q_size, D))
    if not c.tie_embeddings:
        s["lm_head"] = (c.vocab_size, D)
    if c.qk_norm and c.qk_norm_weight:
        s["q_norm"] = (La, hd)
        s["k_norm"] = (La, hd)
    if c.attn_out_gate:
        s["wg"] = (La, D, c.q_size)
    if c.attn_bias:
        s.update(bq=(La, c.q_size), bk=(La, c.kv_size), bv=(La, c.kv_size))
    if c.o_bias:
        s["bo"] = (La, D)
    if c.post_norms:
        s.update(post_attn_norm=(L, D), post_mlp_norm=(L, D))
    if c.residual_gates:
        s.update(res_gate_attn=(L, D), res_gate_mlp=(L, D), post_mlp_norm=(L, D))
    if c.attn_res_block:
        s.update(res_attn=(L, D), res_mlp=(L, D), res_out=(D,))
    if c.attn_sinks:
        s["sinks"] = (La, c.n_heads)
    if c.kda_layers:
        Lk, H, d = len(c.kda_layers), c.kda_heads, c.kda_dim
        s.update(kda_q=(Lk, D, H * d), kda_k=(Lk, D, H * d), kda_v=(Lk, D, H * d), kda_conv=(Lk, 3 * H * d, c.kda_conv),
                 kda_fa=(Lk, D, c.kda_gate_rank), kda_fb=(Lk, c.kda_gate_rank, H * d), kda_dt_bias=(Lk, H * d),
                 kda_A_log=(Lk, H), kda_b=(Lk, D, H), kda_norm=(Lk, d), kda_out=(Lk, H * d, D))
        if c.kda_out_rank:
            s.update(kda_ga=(Lk, D, c.kda_out_rank), kda_gb=(Lk, c.kda_out_rank, H * d))
        else:
            s["kda_g"] = (Lk, D, H * d)
    if c.mla_layers:
        Lx, H, qk = len(c.mla_layers), c.n_heads, c.mla_nope_dim + c.mla_rope_dim
        if c.mla_q_rank:
            s.update(mla_qa=(Lx, D, c.mla_q_rank), mla_q_norm=(Lx, c.mla_q_rank), mla_qb=(Lx, c.mla_q_rank, H * qk))
        else:
            s["mla_q"] = (Lx, D, H * qk)
        s.update(mla_kva=(Lx, D, c.mla_kv_rank + c.mla_rope_dim), mla_kv_norm=(Lx, c.mla_kv_rank),
                 mla_kvb=(Lx, c.mla_kv_rank, H * (c.mla_nope_dim + c.mla_v_dim)), mla_o=(Lx, H * c.mla_v_dim, D))
        if c.mla_out_gate:
            s["mla_g"] = (Lx, D, H * c.mla_v_dim)
    if c.gdn_layers:
        Lg, qk, vv, Hv = len(c.gdn_layers), c.gdn_k_heads * c.gdn_k_dim, c.gdn_v_heads * c.gdn_v_dim, c.gdn_v_heads
        s.update(gdn_q=(Lg, D, qk), gdn_k=(Lg, D, qk), gdn_v=(Lg, D, vv), gdn_z=(Lg, D, vv), gdn_b=(Lg, D, Hv),
                 gdn_a=(Lg, D, Hv), gdn_conv=(Lg, c.gdn_conv_dim, c.gdn_conv), gdn_A_log=(Lg, Hv),
                 gdn_dt_bias=(Lg, Hv), gdn_norm=(Lg, c.gdn_v_dim), gdn_out=(Lg, vv, D))
    Ld, Lm = c.n_dense_layers, c.n_moe_layers
    if Ld:
        s.update(gate=(Ld, D, c.ffn), up=(Ld, D, c.ffn), down=(Ld, c.ffn, D))
    if Lm:
        E, Fm, De = c.n_experts, c.moe_ffn, c.moe_latent or D  # De: the experts' input and output width
        s.update(router=(Lm, D, E), router_bias=(Lm, E),
                 e_gate=(Lm, E, De, Fm), e_up=(Lm, E, De, Fm), e_down=(Lm, E, Fm, De))
        if c.moe_latent:
            s.update(latent_down=(Lm, D, De), latent_norm=(Lm, De), latent_up=(Lm, De, D))
            if c.moe_latent_style == "muse":
                s["expert_norm"] = (Lm, De)
        if c.expert_bias:
            s.update(e_gate_b=(Lm, E, Fm), e_up_b=(Lm, E, Fm), e_down_b=(Lm, E, D))
        if c.n_shared_experts:
            Fs = c.n_shared_experts * Fm
            s.update(s_gate=(Lm, D, Fs), s_up=(Lm, D, Fs), s_down=(Lm, Fs, D))
            if c.shared_expert_gate:
                s["shared_gate"] = (Lm, D)
    return s


def arrays_sha256(arrays: dict[str, np.ndarray]) -> str:
    """sha256 over names, shapes and bytes: the identity of generated (not file-backed) weights."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name], dtype=np.float32)
        h.update(f"{name}:{a.shape};".encode())
        h.update(a.tobytes())
    return h.hexdigest()


# Damping of the mini models' random weights. Measured with tests/engines/test_mini.py:
# perturbing one embedding entry by one ulp moves the final logits by at most 1.5e-5 over 4
# layers (not chaotic), and the k-th/(k+1)-th expert gap is < 1e-3 for only 1.0% of decisions.
MINI_OUT_PROJ_SCALE = 0.5  # wo and down: half the variance-preserving std keeps the residual tame
MINI_LOGIT_SCALE = 4.0  # lm_head std, so greedy argmax has clear margins (not constant near-ties)
MINI_ROUTER_SCALE = 16.0  # router std: decisive expert choice (bf16 noise rarely flips an expert)
MINI_SEED = 20261130


def random_weights(c: Config, seed: int = MINI_SEED) -> Weights:
    """Seeded Gaussian weights for a Config, damped as described above."""
    rng = np.random.default_rng(seed)
    shapes = expected_shapes(c)
    arrays: dict[str, np.ndarray] = {}
    for name in sorted(shapes):  # sorted: the draw order, and so the weights, never depend on dict order
        shape = shapes[name]
        if name.endswith("norm"):  # gemma style stores offsets (scale 1 + w): near 0, as in trained checkpoints
            offset = (c.final_norm_style or c.norm_style) if name == "final_norm" else c.norm_style
            a = (0.0 if offset == "gemma" else 1.0) + 0.1 * rng.standard_normal(shape)
        elif name == "embed":
            a = rng.standard_normal(shape)
        elif name == "lm_head":
            a = MINI_LOGIT_SCALE * rng.standard_normal(shape) / np.sqrt(shape[-1])
        elif name == "router":
            a = MINI_ROUTER_SCALE * rng.standard_normal(shape) / np.sqrt(shape[-2])
        elif name == "router_bias":
            a = 0.1 * rng.standard_normal(shape)
        elif name in ("gdn_A_log", "kda_A_log"):  # log U(1, 16) as Qwen3-Next's init: decays exp(-A softplus(.))
            a = np.log(rng.uniform(1.0, 16.0, shape))
        elif name in ("gdn_dt_bias", "kda_dt_bias"):
            a = np.ones(shape) + 0.1 * rng.standard_normal(shape)
        elif name.startswith("res_gate"):  # Muse: beta = sigmoid(g / 0.3) spread over about (0.27, 0.73)
            a = 0.3 * rng.standard_normal(shape)
        elif name.startswith("res_"):  # depth-mixture scores (v . w) / rms(v) of order 1
            a = rng.standard_normal(shape) / np.sqrt(shape[-1])
        elif name in ("gdn_conv", "kda_conv"):  # depthwise taps: fan-in is the taps
            a = rng.standard_normal(shape) / np.sqrt(shape[-1])
        else:
            fan_in = shape[-2]
            out_proj = ("wo", "down", "e_down", "s_down", "gdn_out", "kda_out", "mla_o")
            scale = MINI_OUT_PROJ_SCALE if name in out_proj else 1.0
            a = scale * rng.standard_normal(shape) / np.sqrt(fan_in)
        arrays[name] = a.astype(np.float32)
    return Weights(c, arrays, sha256=arrays_sha256(arrays), source=f"random(seed={seed})")


def mini_llama(seed: int = MINI_SEED) -> Weights:
    return random_weights(MINI_LLAMA, seed)


def mini_moe(seed: int = MINI_SEED) -> Weights:
    return random_weights(MINI_MOE, seed)


def mini_kimi(seed: int = MINI_SEED) -> Weights:
    return random_weights(MINI_KIMI, seed)


def mini_muse(seed: int = MINI_SEED) -> Weights:
    """MINI_MUSE's seeded weights, lm_head 2^2.5 times the other minis': Muse scales the raw logits by 2^-2.5, and
    this gives its mini the others' logit spread (clear greedy margins) under that scale."""
    w = random_weights(MINI_MUSE, seed)
    arrays = {**w.arrays, "lm_head": (w.arrays["lm_head"] * np.float32(2 ** 2.5)).astype(np.float32)}
    return Weights(MINI_MUSE, arrays, sha256=arrays_sha256(arrays), source=f"random(seed={seed}), lm_head x 2^2.5")


def interleaved_to_half(w: np.ndarray, n_heads: int, head_dim: int) -> np.ndarray:
    """Reorder the output columns of a Q/K matrix [D, n_heads*head_dim] from llama.cpp's
    interleaved-pair RoPE order to the half-split (rotate_half) order. Exact (a permutation)."""
    d = w.shape[0]
    return w.reshape(d, n_heads, head_dim // 2, 2).swapaxes(2, 3).reshape(d, n_heads * head_dim)


def half_to_interleaved(w: np.ndarray, n_heads: int, head_dim: int) -> np.ndarray:
    """Inverse of interleaved_to_half (what llama.cpp's converter does to HF checkpoints)."""
    d = w.shape[0]
    return w.reshape(d, n_heads, 2, head_dim // 2).swapaxes(2, 3).reshape(d, n_heads * head_dim)


# The axes of each array that run over the hidden size ("D") or an MLP's inner size ("F" dense, "Fm" one routed
# expert's, "Fs" the shared experts'), for permuted(). Arrays not named have neither (q_norm, k_norm, bq, bk, bv,
# sinks, router_bias: their axes are heads, head_dim or experts).
_REORDERED_AXES = {
    "embed": {1: "D"}, "lm_head": {1: "D"}, "final_norm": {0: "D"}, "attn_norm": {1: "D"}, "mlp_norm": {1: "D"},
    "post_attn_norm": {1: "D"}, "post_mlp_norm": {1: "D"}, "bo": {1: "D"},
    "wq": {1: "D"}, "wk": {1: "D"}, "wv": {1: "D"}, "wo": {2: "D"},
    "gate": {1: "D", 2: "F"}, "up": {1: "D", 2: "F"}, "down": {1: "F", 2: "D"}, "router": {1: "D"},
    "e_gate": {2: "D", 3: "Fm"}, "e_up": {2: "D", 3: "Fm"}, "e_down": {2: "Fm", 3: "D"},
    "e_gate_b": {2: "Fm"}, "e_up_b": {2: "Fm"}, "e_down_b": {2: "D"},
    "s_gate": {1: "D", 2: "Fs"}, "s_up": {1: "D", 2: "Fs"}, "s_down": {1: "Fs", 2: "D"},
    "wg": {1: "D"}, "gdn_q": {1: "D"}, "gdn_k": {1: "D"}, "gdn_v": {1: "D"}, "gdn_z": {1: "D"}, "gdn_b": {1: "D"},
    "gdn_a": {1: "D"}, "gdn_out": {2: "D"},
    "kda_q": {1: "D"}, "kda_k": {1: "D"}, "kda_v": {1: "D"}, "kda_fa": {1: "D"}, "kda_b": {1: "D"}, "kda_ga": {1: "D"},
    "kda_out": {2: "D"}, "kda_g": {1: "D"}, "mla_g": {1: "D"}, "mla_q": {1: "D"}, "mla_qa": {1: "D"},
    "mla_kva": {1: "D"}, "mla_o": {2: "D"}, "res_attn": {1: "D"}, "res_mlp": {1: "D"}, "res_out": {0: "D"},
    "res_gate_attn": {1: "D"}, "res_gate_mlp": {1: "D"}, "shared_gate": {1: "D"},
}
_LATENT_AXES = {"e_gate": {2: "De"}, "e_up": {2: "De"}, "e_down": {3: "De"}, "latent_down": {1: "D", 2: "De"},
                "latent_norm": {1: "De"}, "latent_up": {1: "De", 2: "D"}, "expert_norm": {1: "De"}}
_UNORDERED = ("q_norm", "k_norm", "bq", "bk", "bv", "sinks", "router_bias", "gdn_conv", "gdn_A_log", "gdn_dt_bias",
              "gdn_norm", "kda_conv", "kda_fb", "kda_dt_bias", "kda_A_log", "kda_gb", "kda_norm", "mla_q_norm",
              "mla_qb",
              "mla_kv_norm", "mla_kvb")


def hidden_permutation(c: Config, seed: int) -> np.ndarray:
    """The order permuted(w, seed) gives the hidden dimension: its residual stream's element i is the original's
    element perm[i] (the first permutation drawn there)."""
    return np.random.default_rng(seed).permutation(c.hidden)


def permuted(w: Weights, seed: int) -> Weights:
    """The same model with its hidden and MLP dimensions reordered by a seeded permutation: equal to w in exact
    arithmetic (every op over those dimensions is a sum or elementwise), but every matmul and norm over them sums
    in another order, as another correct kernel's tiling would. The bf16 conditioning witness runs the reference's
    recipe on it (evalsuite/compare/witness.py). Provenance stays w's, with the seed in `source`."""
    c = w.config
    sizes = {"D": c.hidden, "F": c.ffn, "Fm": c.moe_ffn, "Fs": c.n_shared_experts * c.moe_ffn, "De": c.moe_latent}
    rng = np.random.default_rng(seed)
    perm = {k: rng.permutation(n) for k, n in sizes.items()}  # drawn in this fixed order
    arrays = {}
    for name in expected_shapes(c):
        if name not in _REORDERED_AXES and name not in _UNORDERED and name not in _LATENT_AXES:
            raise ModelError(f"permuted(): no reordering is defined for {c.name}'s array {name!r}")
        a = np.asarray(w.arrays[name], np.float32)
        axes = _REORDERED_AXES.get(name, {})
        if c.moe_latent:  # the experts work in the latent, not the hidden size
            axes = {**axes, **_LATENT_AXES.get(name, {})}
        for axis, dim in axes.items():
            a = np.take(a, perm[dim], axis=axis)
        arrays[name] = a
    return Weights(c, arrays, sha256=w.sha256, source=f"{w.source} (dimensions permuted, seed {seed})")
