"""One frozen Config per model; every shape in every engine is derived from it.

The Config and the weights container (engines.weights) are the only things the reference
and the megakernel share. Neither carries any math.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

ROPE_STYLES = ("interleaved", "half")  # (2i, 2i+1) pairs as llama.cpp stores Q/K; or rotate_half (HF)
ROUTERS = ("softmax", "sigmoid")  # softmax top-k (Mixtral/Qwen-MoE/gpt-oss); biased sigmoid (DeepSeek-V3/Kimi)
NORM_STYLES = ("plain", "gemma")  # RMSNorm scale w (Llama) or 1 + w (Gemma: weights stored as offsets)
# SwiGLU (Llama/Qwen), GeGLU with tanh-approximated GELU (Gemma), or Kimi K3's "situ":
# 4 tanh(g / 4) * sigmoid(g) * 25 tanh(u / 25)
MLP_ACTS = ("silu", "gelu_tanh", "situ")
EXPERT_ACTS = ("swiglu", "gptoss", "situ")  # gpt-oss: clamped gate * sigmoid(alpha * gate) * (up + 1)
# gdn: Gated DeltaNet (Qwen3-Next / Qwen3.8) and kda: Kimi Delta Attention (Kimi Linear / K3), recurrent layers;
# mla: multi-head latent attention (Kimi's: NoPE, its shared k_pe never rotated)
LAYER_KINDS = ("full", "sliding", "gdn", "kda", "mla")
RECURRENT = ("gdn", "kda")
ROPE_SCALINGS = ("linear", "llama3", "yarn")
MOE_LATENT_STYLES = ("k3", "muse")


@dataclass(frozen=True)
class Config:
    """Decoder shape. family "dense" (Llama/Qwen) or "moe" (DeepSeek-V3 / Kimi style routing)."""

    name: str
    family: str
    vocab_size: int
    hidden: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int  # intermediate size of the dense MLP layers
    rope_theta: float
    rms_eps: float
    max_context: int
    tie_embeddings: bool
    rope_style: str = "interleaved"
    qk_norm: bool = False  # per-head RMSNorm on q and k before RoPE (Qwen3)
    # Mixture of experts (family == "moe"); layers [0, first_dense) use the dense MLP.
    n_experts: int = 0
    top_k: int = 0
    moe_ffn: int = 0  # intermediate size of each routed expert
    n_shared_experts: int = 0  # shared experts are fused into one MLP of n_shared * moe_ffn
    first_dense: int = 0
    router: str = "softmax"
    norm_topk: bool = True  # renormalise the selected experts' weights to sum to 1
    routed_scale: float = 1.0  # multiplier on the routed experts' weights (DeepSeek-V3: 2.5)
    shared_expert_gate: bool = False  # Qwen3-Next: the shared expert's output times sigmoid(x shared_gate)
    # Kimi K3's latent MoE: the routed experts work in a latent of this width (x Wld), their weighted sum is normed
    # over it (its true width) and brought back up (Wlu); the router and the shared expert read x itself. 0 = off.
    moe_latent: int = 0
    # Kimi K3's attention residuals (engines.reference.residual): the stream is a depth mixture over blocks of this
    # many layers (K3: 12). 0 = the plain residual sum.
    attn_res_block: int = 0
    # ---- the wider families (Qwen2, Gemma 2/3, gpt-oss). Every default is the Llama behaviour. ----
    attn_bias: bool = False  # q/k/v projections carry biases (Qwen2, gpt-oss)
    o_bias: bool = False  # the output projection carries a bias (gpt-oss)
    layer_kinds: tuple[str, ...] = ()  # per layer "full" or "sliding"; () = every layer full
    sliding_window: int = 0  # a sliding layer's query at p sees positions p - window + 1 .. p
    rope_theta_local: float = 0.0  # RoPE base of the sliding layers (Gemma 3: 10,000); 0 = rope_theta
    # RoPE scaling of the full layers, as (key, value) pairs: ("type", "linear"|"llama3"|"yarn") and that
    # type's parameters (factor, original_max_position_embeddings, low/high_freq_factor, beta_fast/slow, ...)
    rope_scaling: tuple[tuple[str, object], ...] = ()
    norm_style: str = "plain"
    post_norms: bool = False  # Gemma 2/3: a norm after attention and after the MLP, before each residual add
    mlp_act: str = "silu"
    embed_scale: bool = False  # Gemma: embeddings multiplied by sqrt(hidden)
    query_scale: float = 0.0  # attention scores scaled by query_scale**-0.5 (Gemma's query_pre_attn_scalar); 0 = hd
    attn_softcap: float = 0.0  # Gemma 2: scores -> cap * tanh(scores / cap); 0 = off
    final_softcap: float = 0.0  # Gemma 2: logits -> cap * tanh(logits / cap); 0 = off
    attn_sinks: bool = False  # gpt-oss: one learned logit per head joins every softmax denominator
    expert_act: str = "swiglu"
    expert_bias: bool = False  # gpt-oss: the experts' projections carry biases
    swiglu_alpha: float = 1.702  # gpt-oss expert_act only
    swiglu_limit: float = 7.0  # gpt-oss expert_act only
    # ---- Qwen3-Next / Qwen3.8 (the Gated DeltaNet hybrid). Every default is the Llama behaviour. ----
    attn_out_gate: bool = False  # q_proj also emits a per-head gate: attention output * sigmoid(gate) before wo
    rotary_dim: int = 0  # RoPE rotates only the first rotary_dim dims of each head; 0 = all of head_dim
    # Gated DeltaNet layers (layer_kinds "gdn"): key/query heads, value heads, their dims, the conv's taps
    gdn_k_heads: int = 0
    gdn_v_heads: int = 0
    gdn_k_dim: int = 0
    gdn_v_dim: int = 0
    gdn_conv: int = 0
    # Kimi Delta Attention layers (layer_kinds "kda"): heads of kda_dim (keys and values alike), the conv's taps, the
    # ranks of the low-rank forget gate (f_a, f_b) and output gate (g_a, g_b; 0: one full projection, as Kimi K3's)
    kda_heads: int = 0
    kda_dim: int = 0
    kda_conv: int = 0
    kda_gate_rank: int = 0
    kda_out_rank: int = 0
    # Kimi K3's forget gate: g = -bound * sigmoid(exp(A_log) * (f + dt_bias)), in (-bound, 0); 0 = Kimi Linear's
    # g = -exp(A_log) * softplus(f + dt_bias)
    kda_gate_bound: float = 0.0
    # Multi-head latent attention layers (layer_kinds "mla"): n_heads heads; q from one projection (mla_q_rank 0) or
    # a normed low-rank pair; a latent of mla_kv_rank (normed) expanded to each head's nope key and value, and a
    # shared mla_rope_dim key part (Kimi: never rotated). Keys are nope + rope wide, values mla_v_dim.
    mla_q_rank: int = 0
    mla_kv_rank: int = 0
    mla_nope_dim: int = 0
    mla_rope_dim: int = 0
    mla_v_dim: int = 0
    mla_norm_eps: float = 1e-6  # the latent norms' eps: DeepSeek's and Kimi's code build them with the default 1e-6
    mla_rope: bool = False  # DeepSeek-V3: q's and k_pe's rope dims rotated (rope_style, rope_theta); Kimi: NoPE
    mla_out_gate: bool = False  # Kimi K3: the heads' output times sigmoid(x Wg) before Wo
    # ---- Muse Spark (engines.reference.residual.Gated and the switches below). Every default is Llama's. ----
    nope_full: bool = False  # the "full" layers carry no RoPE (Muse: NoPE full layers, rotated sliding ones)
    qk_norm_weight: bool = True  # False: the QK norm is parameter-free (Muse), no q_norm / k_norm arrays
    attn_out_norm: bool = False  # Muse: the attention output RMS-normed per head (no weight) before its sigmoid gate
    embed_norm: bool = False  # Muse: the stream starts as rms(embed[token]) (no weight)
    final_norm_style: str = ""  # the final norm's style where it differs from norm_style (Muse: "plain"); "" = same
    logit_scale: float = 1.0  # raw logits times this before final_softcap (Muse: 2^-2.5 under a cap of 20)
    # Muse's gated f32 residual: s = alpha s + beta postnorm(branch), alpha and beta per channel from one learned
    # vector per branch (res_gate_attn / res_gate_mlp); the post-norms are Muse's (residual.Gated)
    residual_gates: bool = False
    router_logit_scale: float = 1.0  # router logits times this before the sigmoid / softmax (Muse: 2^-2.5)
    router_eps: float = 0.0  # added to the top-k weights' sum when renormalising them (Muse: 1e-15)
    # with moe_latent: "k3" (experts in x Wld, their weighted sum normed, then Wlu) or "muse" (experts read
    # rms(x Wld) * norm weight; each expert's output is normed (its own weight, eps MOE_POST_EPS) before the sum)
    moe_latent_style: str = "k3"

    def __post_init__(self) -> None:
        if self.family not in ("dense", "moe"):
            raise ValueError(f"family must be 'dense' or 'moe', got {self.family!r}")
        if self.rope_style not in ROPE_STYLES:
            raise ValueError(f"rope_style must be one of {ROPE_STYLES}, got {self.rope_style!r}")
        if self.router not in ROUTERS:
            raise ValueError(f"router must be one of {ROUTERS}, got {self.router!r}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} not a multiple of n_kv_heads {self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        choices = (("norm_style", self.norm_style, NORM_STYLES), ("mlp_act", self.mlp_act, MLP_ACTS),
                   ("expert_act", self.expert_act, EXPERT_ACTS))
        for field_, value, allowed in choices:
            if value not in allowed:
                raise ValueError(f"{field_} must be one of {allowed}, got {value!r}")
        if self.layer_kinds:
            if len(self.layer_kinds) != self.n_layers or set(self.layer_kinds) - set(LAYER_KINDS):
                raise ValueError(f"layer_kinds must list {self.n_layers} of {LAYER_KINDS}, got {self.layer_kinds}")
            if "sliding" in self.layer_kinds and self.sliding_window < 1:
                raise ValueError("sliding layers need sliding_window >= 1")
            if not self.kv_layers:
                raise ValueError("at least one attention or MLA layer is needed (the cache's slots are counted there)")
            if "gdn" in self.layer_kinds:
                dims = (self.gdn_k_heads, self.gdn_v_heads, self.gdn_k_dim, self.gdn_v_dim, self.gdn_conv)
                if min(dims) < 1 or self.gdn_v_heads % self.gdn_k_heads or self.gdn_conv < 2:
                    raise ValueError(f"gdn layers need gdn_k_heads, gdn_v_heads (a multiple of it), gdn_k_dim, "
                                     f"gdn_v_dim >= 1 and gdn_conv >= 2, got {dims}")
            if "kda" in self.layer_kinds and min(self.kda_heads, self.kda_dim, self.kda_gate_rank,
                                                 self.kda_out_rank + 1, self.kda_conv - 1) < 1:
                raise ValueError("kda layers need kda_heads, kda_dim, kda_gate_rank >= 1, kda_out_rank >= 0, "
                                 "kda_conv >= 2")
            if "mla" in self.layer_kinds and min(self.mla_kv_rank, self.mla_nope_dim, self.mla_v_dim) < 1:
                raise ValueError("mla layers need mla_kv_rank, mla_nope_dim and mla_v_dim >= 1")
        if self.final_norm_style not in ("",) + NORM_STYLES:
            raise ValueError(f"final_norm_style must be '' or one of {NORM_STYLES}, got {self.final_norm_style!r}")
        if self.moe_latent_style not in MOE_LATENT_STYLES:
            raise ValueError(f"moe_latent_style must be one of {MOE_LATENT_STYLES}, got {self.moe_latent_style!r}")
        if self.residual_gates and (self.post_norms or self.attn_res_block):
            raise ValueError("residual_gates replaces the residual sum: not with post_norms or attn_res_block")
        if self.rotary_dim and (self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.head_dim):
            raise ValueError(f"rotary_dim must be even and in (0, head_dim], got {self.rotary_dim}")
        scaling = dict(self.rope_scaling)
        if scaling and scaling.get("type") not in ROPE_SCALINGS:
            raise ValueError(f"rope_scaling type must be one of {ROPE_SCALINGS}, got {scaling.get('type')!r}")
        if self.family == "moe":
            if not (0 < self.top_k <= self.n_experts):
                raise ValueError(f"need 0 < top_k <= n_experts, got {self.top_k}, {self.n_experts}")
            if not (0 <= self.first_dense < self.n_layers):
                raise ValueError(f"first_dense must be in [0, n_layers), got {self.first_dense}")

    @property
    def n_dense_layers(self) -> int:
        """Layers that use the dense MLP (all of them for the dense family)."""
        return self.n_layers if self.family == "dense" else self.first_dense

    @property
    def n_moe_layers(self) -> int:
        return self.n_layers - self.n_dense_layers

    @property
    def q_size(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def attn_layers(self) -> tuple[int, ...]:
        """The layers with (grouped-query) attention; the attention arrays (wq, ...) are stacked over these only."""
        return tuple(i for i in range(self.n_layers) if self.kind(i) in ("full", "sliding"))

    @property
    def kv_layers(self) -> tuple[int, ...]:
        """The layers with a KV cache (attention or MLA), whose slots grow with the context."""
        return tuple(i for i in range(self.n_layers) if self.kind(i) not in RECURRENT)

    @property
    def kda_layers(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.n_layers) if self.kind(i) == "kda")

    @property
    def mla_layers(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.n_layers) if self.kind(i) == "mla")

    def cache_dims(self, layer: int) -> tuple[int, int, int]:
        """(heads, key dim, value dim) of a KV-cache layer's K and V."""
        if self.kind(layer) == "mla":
            return self.n_heads, self.mla_nope_dim + self.mla_rope_dim, self.mla_v_dim
        return self.n_kv_heads, self.head_dim, self.head_dim

    @property
    def gdn_layers(self) -> tuple[int, ...]:
        """The Gated DeltaNet layers (a recurrent state); the gdn_* arrays are stacked over these only."""
        return tuple(i for i in range(self.n_layers) if self.kind(i) == "gdn")

    @property
    def gdn_conv_dim(self) -> int:
        """Channels of the GDN layers' causal conv: q, k (gdn_k_heads x gdn_k_dim each) and v."""
        return 2 * self.gdn_k_heads * self.gdn_k_dim + self.gdn_v_heads * self.gdn_v_dim

    @property
    def rope_dim(self) -> int:
        """The dims of each head RoPE rotates."""
        return self.rotary_dim or self.head_dim

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def kind(self, layer: int) -> str:
        """"full" or "sliding" for this layer."""
        return self.layer_kinds[layer] if self.layer_kinds else "full"

    def features(self) -> list[str]:
        """The fields set away from the Llama/DeepSeek defaults (an engine that implements only those refuses
        a model that names any: engines.megakernel)."""
        base = Config(name="", family="dense", vocab_size=1, hidden=1, n_layers=1, n_heads=1, n_kv_heads=1,
                      head_dim=2, ffn=1, rope_theta=1.0, rms_eps=1.0, max_context=1, tie_embeddings=False)
        wide = ("attn_bias", "o_bias", "layer_kinds", "sliding_window", "rope_theta_local", "rope_scaling",
                "norm_style", "post_norms", "mlp_act", "embed_scale", "query_scale", "attn_softcap",
                "final_softcap", "attn_sinks", "expert_act", "expert_bias", "attn_out_gate", "rotary_dim",
                "moe_latent", "attn_res_block", "nope_full", "qk_norm_weight", "attn_out_norm", "embed_norm",
                "final_norm_style", "logit_scale", "residual_gates", "router_logit_scale", "router_eps",
                "moe_latent_style", "shared_expert_gate")
        mine, theirs = self.to_dict(), base.to_dict()
        out = [f for f in wide if mine[f] != theirs[f] and not (f == "layer_kinds" and set(mine[f]) == {"full"})]
        kinds = sorted(set(self.layer_kinds) - {"full"})
        return [f"layer_kinds ({', '.join(kinds)})" if f == "layer_kinds" else f for f in out]


MINI_LLAMA = Config(
    name="mini-llama", family="dense", vocab_size=320, hidden=64, n_layers=4, n_heads=4,
    n_kv_heads=2, head_dim=16, ffn=128, rope_theta=10000.0, rms_eps=1e-5, max_context=2048,
    tie_embeddings=False, rope_style="interleaved",
)

MINI_MOE = Config(
    name="mini-moe", family="moe", vocab_size=320, hidden=64, n_layers=4, n_heads=4,
    n_kv_heads=2, head_dim=16, ffn=128, rope_theta=10000.0, rms_eps=1e-5, max_context=2048,
    tie_embeddings=True, rope_style="half", qk_norm=False,
    n_experts=8, top_k=2, moe_ffn=32, n_shared_experts=1, first_dense=1,
    router="sigmoid", norm_topk=True, routed_scale=2.5,
)

# Kimi K3's layer stack in miniature (ARCHITECTURES.md section 6, row 7): KDA layers with K3's bounded forget gate and
# full output gate, NoPE MLA with its output gate at i % 4 == 3 (and the last layer), layer 0 dense and the rest K3's
# latent MoE with the situ activation, attention residuals over blocks of 2 layers (4 blocks).
MINI_KIMI = Config(
    name="mini-kimi", family="moe", vocab_size=320, hidden=64, n_layers=8, n_heads=4, n_kv_heads=4, head_dim=24,
    ffn=128, rope_theta=10000.0, rms_eps=1e-5, max_context=2048, tie_embeddings=False,
    layer_kinds=("kda", "kda", "kda", "mla", "kda", "kda", "kda", "mla"), kda_heads=4, kda_dim=16, kda_conv=4,
    kda_gate_rank=16, kda_out_rank=0, kda_gate_bound=5.0, mla_q_rank=32, mla_kv_rank=32, mla_nope_dim=16,
    mla_rope_dim=8, mla_v_dim=16, mla_out_gate=True, n_experts=16, top_k=4, moe_ffn=32, n_shared_experts=2,
    first_dense=1, router="sigmoid", norm_topk=True, routed_scale=1.0, mlp_act="situ", expert_act="situ",
    moe_latent=32, attn_res_block=2,
)

# Muse Spark's layer stack in miniature (ARCHITECTURES.md section 3 and section 6, row 1, at the wave-1 dims): NoPE
# full attention at l % 4 == 1, sliding layers (a window of 16 that includes the query) with rotate-half RoPE at
# theta 5e5, parameter-free QK norm, the per-head-normed sigmoid-gated output, scale 5.4730064863875 / sqrt(hd), the
# gated residual, a normed embedding, logits 20 tanh(raw 2^-2.5 / 20), and a MoE on every layer (sigmoid router at
# 2^-2.5 whose bias selects only, experts in a normed latent, each expert's output normed) with no shared expert.
MUSE_ATTN_SCALE = 5.4730064863875  # Muse Spark's attention scale is this over sqrt(head_dim)
MINI_MUSE = Config(
    name="mini-muse", family="moe", vocab_size=320, hidden=64, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=16,
    ffn=128, rope_theta=5e5, rms_eps=1e-5, max_context=2048, tie_embeddings=False, rope_style="half",
    layer_kinds=("sliding", "full", "sliding", "sliding"), sliding_window=16, nope_full=True, qk_norm=True,
    qk_norm_weight=False, query_scale=16 / MUSE_ATTN_SCALE ** 2, attn_out_gate=True, attn_out_norm=True,
    norm_style="gemma", final_norm_style="plain", embed_norm=True, final_softcap=20.0, logit_scale=2 ** -2.5,
    residual_gates=True, n_experts=8, top_k=2, moe_ffn=32, first_dense=0, router="sigmoid", norm_topk=True,
    router_logit_scale=2 ** -2.5, router_eps=1e-15, moe_latent=32, moe_latent_style="muse",
)
