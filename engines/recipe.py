"""A bf16 engine's declared numeric recipe: where it rounds. The judge runs the reference in the same recipe, so a
bf16 engine is compared with like, not only with float32 (engines.base re-exports Recipe)."""

from __future__ import annotations

from dataclasses import dataclass

DTYPES = ("float32", "bfloat16")
# Where a recipe may round to bf16 inside a linear-attention layer (GDN, KDA) besides its matmul inputs: the points
# the public TPU decode kernels round at (docs/megakernel.md, "Its bf16 recipe against the public kernels' rounding
# points"). Each is one rounding in the engine and one in the reference.
ROUND_POINTS = {
    "projections": "the projections' outputs (q|k|v, the output gate's logits, beta's and the decay's inputs) as they "
                   "leave the matmul, so the conv state holds bf16 values",
    "conv": "the short conv's output, after its SiLU",
    "beta": "beta, after its sigmoid",
    "out_gate": "the output norm times its weight, the gate's activation, and their product, each",
}


@dataclass(frozen=True)
class Recipe:
    """Where an engine in bfloat16 mode rounds. Matrices are stored in bfloat16 and every matmul rounds its input to
    bfloat16 and accumulates in float32; norms, biases, RoPE, softmax and the values named float32 below stay
    float32, and the linear-attention layers round at `rounds` (ROUND_POINTS) besides."""

    f32_weights: tuple[str, ...] = ()  # weight arrays kept float32 besides norms and biases (e.g. "router")
    kv_cache: str = "float32"  # what a written K/V slot is rounded to
    residual: str = "float32"  # what the residual stream is rounded to after each add
    # MLA layers: "expanded" (per-head keys and values cached, formed from the latent rounded for W_kvb) or
    # "absorbed" (the latent cached; q_nope rounded for W_uk, the softmax's mixture of latents for W_uv)
    mla: str = "expanded"
    rounds: tuple[str, ...] = ()  # ROUND_POINTS rounded to bf16 in the linear-attention layers

    def __post_init__(self):
        for name, value, allowed in (("kv_cache", self.kv_cache, DTYPES), ("residual", self.residual, DTYPES),
                                     ("mla", self.mla, ("expanded", "absorbed"))):
            if value not in allowed:
                raise ValueError(f"Recipe.{name} must be one of {allowed}, got {value!r}")
        bad = [p for p in self.rounds if p not in ROUND_POINTS]
        if bad:
            raise ValueError(f"Recipe.rounds: unknown points {bad}; expected some of {', '.join(ROUND_POINTS)}")

    def rounds_at(self, point: str) -> bool:
        """Whether the recipe rounds a linear-attention layer's value at point (one of ROUND_POINTS)."""
        assert point in ROUND_POINTS, point
        return point in self.rounds

    def describe(self) -> dict:
        return {"weights_and_matmul_inputs": "bfloat16", "accumulation": "float32", "kv_cache": self.kv_cache,
                "f32_weights": ["norms", "biases", *self.f32_weights], "residual": self.residual,
                **({"mla": self.mla} if self.mla != "expanded" else {}),
                **({"rounds": list(self.rounds)} if self.rounds else {})}


FLOAT32 = Recipe()  # nothing rounded: a float32 engine's numerics (and the defaults of a bf16 one)
