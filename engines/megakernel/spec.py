"""The megakernel's static facts: which weight stacks it streams and in what dtype, and the spec of one compiled
decode step (shapes, tiles, buffers, the fault's knobs). Shared by the kernel, its VMEM budget and the engine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp
import numpy as np

from engines.config import Config
from engines.megakernel import ops, recurrent
from engines.megakernel.faults import Knobs
from engines.recipe import FLOAT32, Recipe


def layer_keys(c: Config) -> tuple[str, ...]:
    """Every layer's norms ([L] stacks), streamed with its mixer's arrays."""
    return ("attn_norm", "mlp_norm") + (("post_attn_norm", "post_mlp_norm") if c.post_norms else ()) \
        + (("res_attn", "res_mlp") if c.attn_res_block else ()) \
        + (("res_gate_attn", "res_gate_mlp", "post_mlp_norm") if c.residual_gates else ())  # K3's, Muse's residuals


def attn_keys(c: Config) -> tuple[str, ...]:
    """An attention layer's arrays ([La] stacks: Config.attn_layers), streamed together."""
    if not c.attn_layers:
        return ()
    return (("wq", "wk", "wv", "wo") + (("q_norm", "k_norm") if c.qk_norm and c.qk_norm_weight else ())
            + (("bq", "bk", "bv") if c.attn_bias else ()) + (("bo",) if c.o_bias else ())
            + (("sinks",) if c.attn_sinks else ()) + (("wg",) if c.attn_out_gate else ()))


def recurrent_keys(c: Config) -> tuple[str, ...]:
    """The linear-attention layers' arrays ([n] stacks per kind, in the engine's fused layout:
    engines.megakernel.recurrent)."""
    return tuple(k for kind in recurrent.kinds(c) for k in recurrent.keys(c, kind))


# Layer kinds in the kernel's SMEM table (row 0; row 1 holds the layer's index in its kind's stacks)
KIND_CODES = {"full": 0, "sliding": 1, "mla": 2, "gdn": 3, "kda": 4}
ATTENTION_CODES = 2  # codes below this are (grouped-query) attention layers
CACHE_CODES = 3  # codes below this read a KV cache (attention and MLA layers)


def stack(c: Config, layer: int) -> str:
    """The weight stacks a layer's mixer indexes: "attention" (full and sliding share them) or its kind's."""
    return "attention" if c.kind(layer) in ("full", "sliding") else c.kind(layer)


# An MLA layer's decode form (--engine-option mla): "expanded", each head's key [k_nope | k_pe] and value cached;
# "absorbed", the normed latent and k_pe cached once a token (DeepSeek's and Kimi's decode kernels), W_uk folded into
# the query and W_uv applied after the softmax (engines.megakernel.mla)
MLA_FORMS = ("expanded", "absorbed")


def cache_dims(c: Config, mla: str = "expanded") -> tuple[int, int, int]:
    """(heads, key width, value width) of the KV cache: the attention layers' (K, hd, hd), or the MLA layers'
    (H, n + r, v) in the expanded per-head form and (1, rank + r, rank) in the absorbed one (a model has attention
    or MLA layers, not both: engines.megakernel.checks)."""
    if c.mla_layers and mla == "absorbed":  # one "head" every query head reads: keys [latent | k_pe], values the latent
        return 1, c.mla_kv_rank + c.mla_rope_dim, c.mla_kv_rank
    if c.mla_layers:
        return c.n_heads, c.mla_nope_dim + c.mla_rope_dim, c.mla_v_dim
    return c.n_kv_heads, c.head_dim, c.head_dim


def kv_layers(c: Config) -> int:
    """The layers with a KV cache (the cache's leading axis)."""
    return len(c.kv_layers)


def mode_dtype(arrays: dict):
    """The weights' dtype in this mode: a mixer's output projection's (every model has one of them)."""
    return next(arrays[k].dtype for k in ("wo", "mla_o", "gdn_out", "kda_out") if k in arrays)


def cache_shapes(c: Config, batch: int, slots: int, mla: str = "expanded") -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The K and V caches: [Lkv, B, heads, slots, key width] and [.., value width]."""
    K, dk, dv = cache_dims(c, mla)
    return (kv_layers(c), batch, K, slots, dk), (kv_layers(c), batch, K, slots, dv)


def mla_keys(c: Config, mla: str = "expanded") -> tuple[str, ...]:
    """An MLA layer's arrays ([Lx] stacks); the absorbed form's W_kvb as W_uk and W_uv per head."""
    if not c.mla_layers:
        return ()
    q = ("mla_qa", "mla_q_norm", "mla_qb") if c.mla_q_rank else ("mla_q",)
    up = ("mla_uk", "mla_uv") if mla == "absorbed" else ("mla_kvb",)
    return q + ("mla_kva", "mla_kv_norm") + up + ("mla_o",) + (("mla_g",) if c.mla_out_gate else ())

# Config fields away from the Llama/DeepSeek defaults that the kernel implements (Config.features names them):
# Qwen2's biases, Gemma 2/3's and gpt-oss's layers, Qwen3-Next's Gated DeltaNet hybrid
SUPPORTED_FEATURES = ("attn_bias", "o_bias", "layer_kinds (sliding)", "sliding_window", "rope_theta_local",
                      "rope_scaling", "norm_style", "post_norms", "mlp_act", "embed_scale", "query_scale",
                      "attn_softcap", "final_softcap", "attn_sinks", "expert_act", "expert_bias",
                      "attn_out_gate", "rotary_dim", "shared_expert_gate", "moe_latent", "attn_res_block",
                      # Muse Spark's (engines.megakernel.kernel, prefill)
                      "nope_full", "qk_norm_weight", "attn_out_norm", "embed_norm", "final_norm_style", "logit_scale",
                      "residual_gates", "router_logit_scale", "router_eps", "moe_latent_style")
# RMSNorm weights: Gemma's (1 + w) is folded in as the arrays are placed (the kernel's norms then all scale by w)
NORM_KEYS = ("attn_norm", "mlp_norm", "q_norm", "k_norm", "post_attn_norm", "post_mlp_norm", "final_norm")
MUSE_NORM_KEYS = ("latent_norm", "expert_norm")  # Muse's latent MoE norms take the model's style too (K3's: plain)


def norm_weight(c: Config, key: str, a, rounded: bool = False):
    """The scale a norm applies: w, or Gemma's 1 + w (float32, as the norms always are; rounded: bf(1 + w), the
    recipe's norm_weights point); the final norm in its own style where the model gives one (Muse: plain)."""
    muse = c.moe_latent_style == "muse" and key in MUSE_NORM_KEYS
    style = (c.final_norm_style or c.norm_style) if key == "final_norm" else \
        c.norm_style if key in NORM_KEYS or muse else "plain"
    if style != "gemma":
        return a
    scale = np.asarray(a, np.float32) + np.float32(1.0)
    return scale.astype(jnp.bfloat16).astype(np.float32) if rounded else scale


def dense_keys(c: Config) -> tuple[str, ...]:
    return ("gate", "up", "down") if c.n_dense_layers else ()


def moe_keys(c: Config) -> tuple[str, ...]:
    """A MoE layer's arrays streamed whole per layer (the routed experts stream one by one: expert_keys)."""
    if not c.n_moe_layers:
        return ()
    shared = ("s_gate", "s_up", "s_down") if c.n_shared_experts else ()
    return ("router", "router_bias") + shared + (("shared_gate",) if c.shared_expert_gate else ()) \
        + (("latent_down", "latent_norm", "latent_up") if c.moe_latent else ()) \
        + (("expert_norm",) if c.moe_latent and c.moe_latent_style == "muse" else ())  # K3's, Muse's latent


EXPERT_FORMATS = ("dense", "mxfp4")  # the routed experts in HBM: the mode's dtype, or MXFP4 (engines.megakernel.mxfp4)


def expert_keys(c: Config, experts: str = "dense") -> tuple[str, ...]:
    """A routed expert's arrays, copied together when it is chosen (gpt-oss's with their biases); in MXFP4 each
    matrix is KEY_q (codes) and KEY_s (scales)."""
    if not c.n_moe_layers:
        return ()
    mats = ("e_gate", "e_up", "e_down")
    if experts == "mxfp4":
        mats = tuple(f"{k}_{part}" for k in mats for part in ("q", "s"))
    return mats + (("e_gate_b", "e_up_b", "e_down_b") if c.expert_bias else ())


def streamed_keys(c: Config, mla: str = "expanded") -> tuple[str, ...]:
    """The per-layer weight stacks the kernel streams from HBM a layer at a time, in its order (the dense MLP
    streams in column chunks, the routed experts one by one)."""
    return layer_keys(c) + attn_keys(c) + mla_keys(c, mla) + recurrent_keys(c) + moe_keys(c)


# The dense MLP streams through VMEM in chunks of its hidden columns (gate and up columns, down rows), two chunk
# buffers, each chunk at most this many bytes: a quarter of TPU v7's 64 MiB of VMEM a TensorCore, so the pair takes
# half and a layer's attention weights, KV tiles and staging keep the rest. A sizing choice, not a measurement.
MLP_CHUNK_BYTES = 16 << 20


def mlp_chunks(c: Config, dtype: str) -> int:
    """Chunks of the dense MLP: the fewest that divide its width with each chunk's three slices within
    MLP_CHUNK_BYTES (1 for every model small enough, so its numbers are the unchunked ones)."""
    item = 2 if dtype == "bfloat16" else 4
    return next(n for n in range(1, c.ffn + 1) if c.ffn % n == 0 and 3 * c.hidden * (c.ffn // n) * item
                <= MLP_CHUNK_BYTES or n == c.ffn)


def expert_slots(spec) -> int:
    """Routed-expert copies a MoE layer can need at most: every row's top-k distinct, or all experts."""
    c = spec.config
    return min(c.n_experts, spec.rows * c.top_k)


KEEP_F32 = ("router", "shared_gate")  # besides the vectors (norms and biases): tiny, precision-critical
EXPERT_VECTORS = ("e_gate_b", "e_up_b", "e_down_b")  # an expert's biases: vectors, float32, [Lm, E, 1, X] rows


def hbm_dtype(key: str, dtype: str, rank: int = 2) -> str:
    """A streamed array's dtype in the mode `dtype` (bf16 mode: bf16 matrices; vectors, i.e. norms and biases of
    per-layer rank 1, and the router float32; MXFP4 codes and scales bytes)."""
    if key.startswith("e_") and key.endswith(("_q", "_s")):  # MXFP4 expert codes and scales (not mla_q)
        return "uint8"
    return "float32" if key in KEEP_F32 or rank == 1 else dtype


def hbm_arrays(w, dtype: str, experts: str = "dense", mla: str = "expanded", uk_transposed: bool = False,
               round_norms: bool = False) -> dict:
    """The kernel's HBM-resident per-layer stacks (w: engines.weights.Weights): vectors become [n, 1, X] rows; experts
    "mxfp4": the routed experts' matrices encoded (a ValueError when MXFP4 cannot hold them exactly); mla "absorbed":
    W_uk and W_uv per head for the kernel (uk_transposed: the fault's), W_kvb kept for the XLA prefill; round_norms:
    (1 + w) norm weights placed as bf(1 + w) (the recipe's norm_weights point)."""
    from engines.megakernel import mla as mla_math
    from engines.megakernel import mxfp4

    out = {}
    a, dt = w.arrays, jnp.dtype(dtype)
    if w.config.mla_layers and mla == "absorbed":
        out["mla_kvb"] = jnp.asarray(a["mla_kvb"], dt)
        out["mla_uk"], out["mla_uv"] = (jnp.asarray(x, dt) for x in mla_math.absorbed_weights(
            w.config, a["mla_kvb"], uk_transposed))
    for kind in recurrent.kinds(w.config):  # q|k|v (and GDN's b|a) fused, the conv taps-major, vectors as rows
        out[f"{kind}_qkv"] = jnp.asarray(np.concatenate([a[f"{kind}_{x}"] for x in "qkv"], -1), dt)
        out[f"{kind}_conv"] = jnp.asarray(a[f"{kind}_conv"].transpose(0, 2, 1), dt)
    if w.config.attn_res_block:  # K3: the final depth mixture's vector (applied after the kernel, with the head)
        out["res_out"] = jnp.asarray(a["res_out"][None, :], jnp.float32)
    if w.config.gdn_layers:
        out["gdn_ba"] = jnp.asarray(np.concatenate([a["gdn_b"], a["gdn_a"]], -1), dt)
    for k in expert_keys(w.config, experts):
        if k.endswith("_q"):
            out[k], out[k[:-2] + "_s"] = (jnp.asarray(a) for a in mxfp4.encode(w.arrays[k[:-2]], k[:-2]))
    for k in streamed_keys(w.config, mla) + expert_keys(w.config, experts):
        if k in out:
            continue
        a = norm_weight(w.config, k, w.arrays[k], round_norms)
        rank = a.ndim - 1  # per layer
        if k in EXPERT_VECTORS:
            a, rank = a[:, :, None, :], 1
        elif rank == 1:  # norms and biases: [n, 1, X] rows
            a = a[:, None, :]
        out[k] = jnp.asarray(a, jnp.dtype(hbm_dtype(k, dtype, rank)))
    n = mlp_chunks(w.config, dtype)
    for k in dense_keys(w.config):  # chunk-major, so a chunk is one contiguous leading-axis slice
        a = w.arrays[k]
        a = a.reshape(a.shape[0], n, -1, a.shape[2]) if k == "down" else \
            a.reshape(a.shape[0], a.shape[1], n, -1).transpose(0, 2, 1, 3)
        out[k] = jnp.asarray(a, jnp.dtype(dtype))  # gate, up [Ld, n, D, F/n]; down [Ld, n, F/n, D]
    return out


def unchunked(a, key: str):
    """One layer's chunked MLP array back to its plain [D, F] (gate, up) or [F, D] (down) layout."""
    n, r, cols = a.shape
    return a.reshape(n * r, cols) if key == "down" else a.transpose(1, 0, 2).reshape(r, n * cols)


def rope_arrays(c: Config, theta_factor: float = 1.0, nope_rotated: bool = False) -> dict:
    """The kernel's RoPE tables: first_q/k [1, heads*hd] and freq_q/k [2, heads*hd] (the full layers'
    frequencies, then the sliding ones'), from engines.megakernel.ops.rope_tables. nope_rotated (the fault's): Muse's
    NoPE full layers rotated as the sliding ones are."""
    out = {}
    for part, heads in (("q", c.n_heads), ("k", c.n_kv_heads)):
        rows = [ops.rope_tables(c.rope_style, c.head_dim, heads, ops.rope_freqs(c, kind, theta_factor)[0]
                                * (0.0 if c.nope_full and kind == "full" and not nope_rotated else 1.0),
                                c.rotary_dim)[:2]
                for kind in ("full", "sliding")]  # Muse's NoPE full layers: frequency 0, the identity rotation
        out[f"first_{part}"] = jnp.asarray(rows[0][0])
        out[f"freq_{part}"] = jnp.asarray(np.concatenate([rows[0][1], rows[1][1]]))
    return out


@dataclass(frozen=True)
class KernelSpec:
    """Static facts of one compiled decode step."""

    config: Config
    batch: int
    slots: int  # KV cache positions per row
    tile: int  # attention tile (cache positions per online-softmax step); divides window
    window: int = 0  # cache positions each layer reads (every row's position is below it); 0: all slots
    knobs: Knobs = Knobs()  # a fault's decode-step knobs (a self-test aid; the defaults: faithful)
    fault_layer: int = 0  # the layer drop_layer skips
    n_buffers: int = 2  # weight buffers; 1 exists only as the race detector's negative control
    want_taps: bool = False
    interpret: Any = True  # True: generic interpreter; pltpu.InterpretParams: TPU interpret mode
    kv_buffers: int = 2  # KV tile buffers; 1 (the next tile copied over the one being read) is the same control
    vmem_limit: int | None = None  # bytes, passed to Mosaic (engines.megakernel.budget); None: Mosaic's default
    experts: str = "dense"  # the routed experts' storage in HBM (EXPERT_FORMATS)
    block: int = 1  # tokens a cache row feeds in the step: 1 (decode) or T (a speculative verify: anchor + drafts)
    # where the step rounds: the cache's storage, the MLA form, the residual stream, the rounding points (the
    # engine's declared bf16 recipe; float32 mode: the defaults, nothing rounded)
    numerics: Recipe = FLOAT32

    @property
    def kv_dtype(self) -> str:
        """The KV cache's storage (bfloat16: half the bytes a step reads)."""
        return self.numerics.kv_cache

    @property
    def mla(self) -> str:
        """An MLA layer's form (MLA_FORMS)."""
        return self.numerics.mla

    @property
    def residual(self) -> str:
        """What the residual stream is rounded to after each add."""
        return self.numerics.residual

    @property
    def rounds(self) -> tuple[str, ...]:
        """The rounding points (engines.recipe.ROUND_POINTS)."""
        return self.numerics.rounds

    @property
    def rows(self) -> int:
        """The kernel's query rows: each cache row's block tokens, row-major (row b*block + t)."""
        return self.batch * self.block
