"""A bf16 engine's declared numeric recipe: where it rounds. The judge runs the reference in the same recipe, so a
bf16 engine is compared with like, not only with float32 (engines.base re-exports Recipe)."""

from __future__ import annotations

from dataclasses import dataclass

DTYPES = ("float32", "bfloat16")
# Where a recipe may round to bf16 besides its matmul inputs: the points the public TPU decode kernels round at
# (docs/megakernel.md, "Its bf16 recipe against the public kernels' rounding points"), each declared by name. Each is
# one rounding in the engine and one in the reference, written apart.
ROUND_POINTS = {
    "projections": "a linear-attention (GDN, KDA) layer's projections (q|k|v, the output gate's logits, beta's and the "
                   "decay's inputs) as they leave the matmul, so the conv state holds bf16 values",
    "conv": "a linear-attention layer's short conv output, after its SiLU",
    "beta": "a linear-attention layer's beta, after its sigmoid",
    "out_gate": "a linear-attention layer's output norm times its weight, the gate's activation, and their product",
    "mla": "an MLA layer's projections as they leave their matmuls (q, the compressed KV, each head's [k_nope | v], "
           "the gate's logits), its normed latent, the attention's output and the gate's sigmoid",
    "latent_moe": "a latent MoE's (Kimi K3's) expert gate and up projections, each expert's output, their weighted "
                  "sum, and the layer's output (the latent path's and the shared expert's sum)",
    "attn_res": "the attention-residual depth mixture's output (what a layer's norm, and the final norm, read)",
    "norm_weights": "a (1 + w) norm weight, rounded once as bf(1 + w) (Muse Spark's norms)",
}
# The layers or parts each point lives in: (what, whether a model has it)
POINT_SCOPE = {
    **{p: ("linear-attention (GDN, KDA) layers", lambda c: bool(c.gdn_layers or c.kda_layers))
       for p in ("projections", "conv", "beta", "out_gate")},
    "mla": ("MLA layers", lambda c: bool(c.mla_layers)),
    "latent_moe": ("a Kimi K3 latent MoE", lambda c: bool(c.moe_latent) and c.moe_latent_style != "muse"),
    "attn_res": ("attention residuals", lambda c: bool(c.attn_res_block)),
    "norm_weights": ("(1 + w) norm weights", lambda c: c.norm_style == "gemma"),
}


# What "public" adds to a point's scope: Kimi's KDA keeps beta float32 (Qwen's GDN rounds it), Kimi Linear's
# ungated MLA is not K3's, and Qwen keeps 1 + w float32 where Muse Spark (the gated-residual family) rounds it.
PUBLIC_ONLY = {"beta": lambda c: bool(c.gdn_layers), "mla": lambda c: bool(c.mla_out_gate),
               "norm_weights": lambda c: bool(c.residual_gates)}


def public_rounds(c) -> tuple[str, ...]:
    """The points the public TPU kernels round at on a model of c's kind (ARCHITECTURES.md section 5), in
    ROUND_POINTS' order: every point in c's scope (POINT_SCOPE) that PUBLIC_ONLY does not narrow away."""
    return tuple(p for p in ROUND_POINTS if POINT_SCOPE[p][1](c) and PUBLIC_ONLY.get(p, lambda c: True)(c))


@dataclass(frozen=True)
class Recipe:
    """Where an engine in bfloat16 mode rounds. Matrices are stored in bfloat16 and every matmul rounds its input to
    bfloat16 and accumulates in float32; norms, biases, RoPE, softmax and the values named float32 below stay
    float32, and the recipe rounds at `rounds` (ROUND_POINTS) besides."""

    f32_weights: tuple[str, ...] = ()  # weight arrays kept float32 besides norms and biases (e.g. "router")
    kv_cache: str = "float32"  # what a written K/V slot is rounded to
    residual: str = "float32"  # what the residual stream is rounded to after each add
    # MLA layers: "expanded" (per-head keys and values cached, formed from the latent rounded for W_kvb) or
    # "absorbed" (the latent cached; q_nope rounded for W_uk, the softmax's mixture of latents for W_uv)
    mla: str = "expanded"
    rounds: tuple[str, ...] = ()  # ROUND_POINTS rounded to bf16

    def __post_init__(self):
        for name, value, allowed in (("kv_cache", self.kv_cache, DTYPES), ("residual", self.residual, DTYPES),
                                     ("mla", self.mla, ("expanded", "absorbed"))):
            if value not in allowed:
                raise ValueError(f"Recipe.{name} must be one of {allowed}, got {value!r}")
        bad = [p for p in self.rounds if p not in ROUND_POINTS]
        if bad:
            raise ValueError(f"Recipe.rounds: unknown points {bad}; expected some of {', '.join(ROUND_POINTS)}")

    def rounds_at(self, point: str) -> bool:
        """Whether the recipe rounds the value at point (one of ROUND_POINTS)."""
        assert point in ROUND_POINTS, point
        return point in self.rounds

    def describe(self) -> dict:
        return {"weights_and_matmul_inputs": "bfloat16", "accumulation": "float32", "kv_cache": self.kv_cache,
                "f32_weights": ["norms", "biases", *self.f32_weights], "residual": self.residual,
                **({"mla": self.mla} if self.mla != "expanded" else {}),
                **({"rounds": list(self.rounds)} if self.rounds else {})}


FLOAT32 = Recipe()  # nothing rounded: a float32 engine's numerics (and the defaults of a bf16 one)
