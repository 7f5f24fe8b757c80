"""One frozen Config per model; every shape in every engine is derived from it.

The Config and the weights container (engines.weights) are the only things the reference
and the megakernel share. Neither carries any math.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

ROPE_STYLES = ("interleaved", "half")  # (2i, 2i+1) pairs as llama.cpp stores Q/K; or rotate_half (HF)
ROUTERS = ("softmax", "sigmoid")  # softmax top-k (Mixtral/Qwen-MoE); biased sigmoid (DeepSeek-V3/Kimi)


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

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


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
