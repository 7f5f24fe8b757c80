"""The megakernel's fault catalogue: self-test aids, each one expression in the engine, each standing
for a bug that fused decode kernels really get wrong. `--fault NAME` on every command builds the
engine with it; benchmarks/detection.py measures which rule catches which (docs/faults.md).

All but stale_feedback live inside the decode kernel (or the decode step's own tables), so a fault
shows from the first decode step on: the prefill is XLA, as on a TPU, and is never faulted.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import numpy as np

NORM_EPS_FAULT = 1e-6  # norm_eps: the epsilon a kernel hard-codes (Llama 2's)
FINAL_NORM_EPS_FAULT = 1e-2  # final_norm_eps
ROPE_THETA_FAULT = 1.01  # rope_theta: the factor on the base
# Where a knob acts: "kernel", the decode step (the Pallas kernel, its RoPE tables and its final norm);
# "head", the reported top-k (decode and prefill heads); "loop", the host loop (cache bookkeeping, prefix cache).
PARTS = ("kernel", "head", "loop")


def _knob(default, part: str):
    return field(default=default, metadata={"part": part})


@dataclass(frozen=True)
class Knobs:
    """What a faulted engine does differently, as named settings; the defaults are the faithful engine. Derived
    once from a fault's name (knobs()); the kernel and the host loop read knobs, never a fault's name."""

    hardcoded_norm_eps: bool = _knob(False, "kernel")  # the layers' RMSNorms use NORM_EPS_FAULT
    final_norm_eps: float | None = _knob(None, "kernel")  # the decode step's final RMSNorm epsilon
    rope_theta_factor: float = _knob(1.0, "kernel")  # on the decode step's RoPE base
    rope_pos_offset: int = _knob(0, "kernel")  # added to every decode-step RoPE position
    pos_in_weights_dtype: bool = _knob(False, "kernel")  # the RoPE position rounded to the weights' dtype
    rows_pos_swapped: bool = _knob(False, "kernel")  # rows 0 and 1 rotate with each other's positions
    scale_dim_offset: int = _knob(0, "kernel")  # attention scale 1/sqrt(head_dim + this)
    gqa_transposed: bool = _knob(False, "kernel")  # query head h reads KV head h % n_kv_heads
    skip_last_tile: bool = _knob(False, "kernel")  # the window's last attention tile (of two or more) skipped
    mask_own_slot: bool = _knob(False, "kernel")  # the causal mask also admits the row's own unwritten slot
    mask_first_slot: bool = _knob(False, "kernel")  # the causal mask drops slot 0
    skip_new_kv: bool = _knob(False, "kernel")  # the new token's own K/V left out of its attention
    new_kv_in_weights_dtype: bool = _knob(False, "kernel")  # the written K/V slot rounded to the weights' dtype
    odd_rows_write_early: bool = _knob(False, "kernel")  # odd rows write their K/V one slot early
    wo_output_in_weights_dtype: bool = _knob(False, "kernel")  # the output projection rounded to the weights' dtype
    split_k_when_batched: bool = _knob(False, "kernel")  # the output projection in two halves at > 1 live row
    drop_layer: bool = _knob(False, "kernel")  # the fault layer's MLP output not added
    gelu_mlp: bool = _knob(False, "kernel")  # tanh-GELU for SiLU in the dense MLP
    bf16_residual: bool = _knob(False, "kernel")  # the residual rounded to bfloat16 after every layer
    router_skip_first: bool = _knob(False, "kernel")  # the router takes ranks 2..k+1
    moe_unnormalized: bool = _knob(False, "kernel")  # top-k routing weights not renormalised
    expert_offset: int = _knob(0, "kernel")  # routed expert e computes with expert e + this's weights
    window_offset: int = _knob(0, "kernel")  # a sliding layer's window is this many slots wider
    softcap_after_mask: bool = _knob(False, "kernel")  # the scores' soft-cap applied after the causal mask
    sink_dropped: bool = _knob(False, "kernel")  # the attention sinks left out of the softmax denominator
    mxfp4_nibbles_swapped: bool = _knob(False, "kernel")  # MXFP4 codes unpacked high nibble first
    decay_after_delta: bool = _knob(False, "kernel")  # GDN: the state's decay applied after the delta update
    conv_unshifted: bool = _knob(False, "kernel")  # GDN: the conv state not shifted by the new token
    l2_eps_outside: bool = _knob(False, "kernel")  # GDN: q and k normed by x / (sqrt(sum x^2) + eps)
    mla_scale_padded: bool = _knob(False, "kernel")  # MLA: scores scaled by the padded key width's ^-1/2
    nope_rotated: bool = _knob(False, "kernel")  # Muse: the decode step's NoPE full layers rotated (their tables')
    mla_pe_rotated: bool = _knob(False, "kernel")  # MLA: the decode step's k_pe rotation switched (Kimi's turned)
    mla_uk_transposed: bool = _knob(False, "kernel")  # absorbed MLA: W_uk's key columns read dim-major, not head-major
    kda_gate_per_head: bool = _knob(False, "kernel")  # KDA: each head's first channel's decay for all its channels
    router_bias_in_weights: bool = _knob(False, "kernel")  # the sigmoid router's selection bias in the weights too
    latent_norm_width: int = _knob(0, "kernel")  # K3: the latent MoE's norm divides by this width (0: the true one)
    res_blocks_short: int = _knob(0, "kernel")  # K3: the depth mixtures read this many blocks too few
    block_mask_ahead: bool = _knob(False, "kernel")  # a verify step's row also attends the next block token's K/V
    topk_renormalized: bool = _knob(False, "head")  # top-k logprobs renormalised over the k ids
    topk_ranks_swapped: bool = _knob(False, "head")  # ranks 2 and 3 carry each other's ids
    stale_feedback: bool = _knob(False, "loop")  # each decode step fed the token of one step earlier
    refill_shifted: bool = _knob(False, "loop")  # a refill of two or more rows: each the next prompt's cache
    shrink_keeps_first: bool = _knob(False, "loop")  # a shrink keeps the first rows, not the live ones
    prefix_kept_padded: bool = _knob(False, "loop")  # a shared prefix kept at its bucket's length

    def set(self) -> dict:
        """The knobs turned, by name: {} for the faithful engine."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != f.default}

    def only(self, *parts: str) -> Knobs:
        """These knobs with those of other parts back at the faithful setting: what a program of those parts
        is built with, so that faults elsewhere share the faithful engine's compiled programs."""
        return replace(self, **{f.name: f.default for f in fields(self) if f.metadata["part"] not in parts})


@dataclass(frozen=True)
class Fault:
    name: str
    knobs: Knobs  # what the engine does differently
    what: str  # what the faulted engine does
    stands_for: str  # the real bug
    needs: str = ""  # "" (any model, any prompt), "moe", "batch" (rows at different positions), "tiles" (>128 ctx)

    @property
    def where(self) -> str:
        """The part (PARTS) its knobs act in."""
        parts = {f.metadata["part"] for f in fields(Knobs) if f.name in self.knobs.set()}
        return next(iter(parts))


CATALOGUE = tuple(Fault(*f) for f in (
    ("rope_off_by_one", Knobs(rope_pos_offset=1), "RoPE rotates every decode-step query and key by position + 1",
     "a position counter advanced before instead of after the step (seen in hand-written decode loops)"),
    ("kv_stale", Knobs(skip_new_kv=True), "the new token's own K/V is left out of its attention",
     "the cache append ordered after the attention read: the step attends to the cache as it was"),
    ("drop_layer", Knobs(drop_layer=True),
     "one layer's MLP output is not added to the residual stream (layer n_layers // 2)",
     "a layer loop whose bounds or buffer-slot parity skips one layer's work"),
    ("bf16_residual", Knobs(bf16_residual=True), "the residual stream is rounded to bfloat16 after every layer",
     "a residual kept in the weights' dtype instead of float32 (a recipe bug: small error everywhere)"),
    ("router_second_choice", Knobs(router_skip_first=True), "the MoE router takes ranks 2..k+1 instead of 1..k",
     "an off-by-one in a hand-written top-k selection", "moe"),
    ("attn_scale", Knobs(scale_dim_offset=1), "attention scores scaled by 1/sqrt(head_dim + 1)",
     "the softmax scale computed from the wrong config field or an off-by-one head size"),
    ("rope_theta", Knobs(rope_theta_factor=ROPE_THETA_FAULT), "the decode step's RoPE base is 1% too large",
     "a RoPE base rounded or read from the wrong field (invisible at short positions: MaxText checks long "
     "prompts for this reason)"),
    ("norm_eps", Knobs(hardcoded_norm_eps=True),
     "the layers' RMSNorms use epsilon 1e-6 where the model says otherwise (SmolLM2: 1e-5)",
     "an epsilon hard-coded in the kernel instead of read from the config"),
    ("final_norm_eps", Knobs(final_norm_eps=FINAL_NORM_EPS_FAULT), "the decode step's final RMSNorm uses epsilon 1e-2",
     "the final norm's epsilon read from the wrong config field (here a value 1,000x the model's)"),
    ("mask_own_slot", Knobs(mask_own_slot=True),
     "a row also attends to its own not-yet-written cache slot (mask <= instead of <)",
     "causal mask off by one: the slot holds zeros, or a previous request's K/V under continuous batching"),
    ("mask_drop_first", Knobs(mask_first_slot=True), "the cache's slot 0 is masked out",
     "causal mask off by one at the other end: drops the first token (often the attention sink)"),
    ("kv_wrong_slot", Knobs(odd_rows_write_early=True),
     "odd batch rows write their new K/V one slot too early (over the previous token's)",
     "a per-row write-back offset computed from the wrong row's length (only batch > 1 shows it)", "batch"),
    ("gqa_transposed", Knobs(gqa_transposed=True), "query head h reads KV head h % n_kv_heads instead of h // group",
     "the GQA head-to-KV-group mapping transposed (a reshape in the wrong order)"),
    ("gelu_mlp", Knobs(gelu_mlp=True), "the dense MLP's activation is swapped (SiLU for tanh-GELU and back)",
     "an activation copied from another family's kernel (GeGLU for SwiGLU, or SwiGLU for Gemma's GeGLU)"),
    ("skip_last_tile", Knobs(skip_last_tile=True),
     "the last attention tile of the cache window is skipped (when there are two or more)",
     "a tile loop bound of n_tiles - 1, or a remainder tile dropped: only contexts past 128 tokens show it",
     "tiles"),
    ("moe_unnormalized", Knobs(moe_unnormalized=True), "the top-k routing weights are not renormalised to sum to 1",
     "a config flag (norm_topk_prob) ignored by the fused MoE", "moe"),
    ("expert_off_by_one", Knobs(expert_offset=1), "routed expert e computes with expert e + 1's weights",
     "an off-by-one in the expert weight slice (a stacked-expert offset)", "moe"),
    ("rows_pos_swapped", Knobs(rows_pos_swapped=True), "batch rows 0 and 1 rotate RoPE with each other's positions",
     "per-row position metadata gathered with the wrong index (only batch > 1 at unequal positions shows it)",
     "batch"),
    ("batch_variant", Knobs(split_k_when_batched=True),
     "the output projection is summed in two halves when more than one row is live",
     "a split-K heuristic chosen by batch size: results depend on the batch (what batch-invariant modes "
     "forbid); differs from batch 1 only in the last bits", "batch"),
    ("stale_feedback", Knobs(stale_feedback=True),
     "from the second decode step on, each row is fed the token sampled one step earlier",
     "a host generation loop that reads the previous step's output buffer (generate() only: teacher-forced "
     "paths feed given tokens)", ""),
    ("refill_wrong_row", Knobs(refill_shifted=True),
     "rows refilled into a live batch two or more at once each get the cache of the next "
     "prompt of their prefill call",
     "a scatter of freshly prefilled rows indexed by the wrong list (continuous batching; one refilled row at a "
     "time, or the first admission, is right)", "refill"),
    ("shrink_wrong_rows", Knobs(shrink_keeps_first=True),
     "when the batch shrinks, the cache keeps its first rows instead of the live ones",
     "a shrink that slices the first B rows where it must gather the live ones (right whenever the live rows "
     "happen to be the first)", "shrink"),
    ("prefix_padded", Knobs(prefix_kept_padded=True),
     "a prompt prefix every row shares is kept at its padded (power-of-two) length",
     "a cached prefix sliced to its bucket instead of its length: the rows' own tokens land at shifted "
     "positions (invisible when the prefix length is a power of two)", "prefix"),
    ("mm_bf16_out", Knobs(wo_output_in_weights_dtype=True),
     "the attention output projection's matmul result is left in the weights' dtype",
     "a matmul without an f32 accumulation/output type (a no-op in float32; one extra rounding in bf16)", "bf16"),
    ("kv_bf16_slot", Knobs(new_kv_in_weights_dtype=True),
     "the decode step's new K/V slot is rounded to the weights' dtype before it is written",
     "a cache write cast to the activation dtype in a recipe that keeps the cache in f32 (a no-op in float32)",
     "bf16"),
    ("pos_weights_dtype", Knobs(pos_in_weights_dtype=True),
     "the decode step's RoPE position is rounded to the weights' dtype",
     "a position vector cast with the activations (bf16 holds integers exactly only up to 256)", "bf16 long"),
    ("window_off_by_one", Knobs(window_offset=1),
     "a sliding layer's query also sees the position one past its window (p - window .. p)",
     "a sliding-window bound written with <= for < (window + 1 keys): only contexts past the window show it",
     "sliding"),
    ("softcap_after_mask", Knobs(softcap_after_mask=True),
     "the attention scores' soft-cap is applied after the causal mask, so masked slots score -cap, not -inf",
     "Gemma 2's tanh cap moved after the mask in a fused kernel: every masked and unwritten slot joins the "
     "softmax's denominator", "softcap"),
    ("sink_dropped", Knobs(sink_dropped=True), "the attention sinks' logits are left out of the softmax denominator",
     "gpt-oss's per-head sink dropped by a kernel ported from a model without sinks", "sinks"),
    ("mxfp4_nibbles", Knobs(mxfp4_nibbles_swapped=True),
     "the MXFP4 experts' codes are unpacked high nibble first (each byte's two rows trade places)",
     "a nibble order swapped between the packer and the kernel's unpacking (MXFP4 holds two codes a byte)",
     "mxfp4"),
    ("decay_after_delta", Knobs(decay_after_delta=True),
     "a GDN or KDA layer's state decay is applied after the delta-rule update (it reads the undecayed memory)",
     "the two lines of the gated delta rule in the wrong order: the decay then multiplies the new write too",
     "recurrent"),
    ("conv_unshifted", Knobs(conv_unshifted=True),
     "a GDN or KDA layer's conv state is not shifted by the new token (each step convolves the prompt's last inputs)",
     "a recurrent state read, used and never written back (a missing store or a donated buffer not returned)",
     "recurrent"),
    ("l2_eps_outside", Knobs(l2_eps_outside=True),
     "GDN's and KDA's q and k L2 norms put the epsilon outside the square root: x / (sqrt(sum x^2) + eps)",
     "an l2norm written as x / (norm + eps), as torch.nn.functional.normalize does, where the model's sums it "
     "inside", "low_norm"),
    ("kda_gate_per_head", Knobs(kda_gate_per_head=True),
     "a KDA layer decays every key channel of a head by that head's first channel's gate",
     "KDA's per-channel forget gate collapsed to GDN's one per head (a kernel ported from Gated DeltaNet)", "kda"),
    ("mla_scale_padded", Knobs(mla_scale_padded=True),
     "MLA scores are scaled by the key width padded to a power of two (mini: 32^-1/2 for 24^-1/2)",
     "a kernel that pads the nope + rope key to the lane width and scales by the padded width (K3: 256^-1/2 for "
     "192^-1/2)", "mla"),
    ("nope_rotated", Knobs(nope_rotated=True),
     "Muse's NoPE full-attention layers rotate the decode step's q and k by RoPE, as its sliding layers do",
     "a per-layer NoPE switch dropped by a kernel that applies one RoPE to every attention layer (the prefill, which "
     "is right, wrote the prompt's keys unrotated)", "nope"),
    ("mla_pe_rotated", Knobs(mla_pe_rotated=True),
     "a NoPE MLA layer (Kimi Linear, K3) rotates the decode step's shared k_pe by its position (rotate-half, the "
     "model's RoPE base); a RoPE'd one (DeepSeek-V3) leaves it raw",
     "a decode kernel ported from DeepSeek-V3's MLA, whose k_pe is rotated, to Kimi's, whose is not, or the other way "
     "(the prefill, which is right, wrote the prompt's keys as the model has them)", "mla"),
    ("mla_uk_transposed", Knobs(mla_uk_transposed=True),
     "absorbed MLA: each head's W_uk is taken from W_kvb's key columns read dim-major ((n h), not (h n))",
     "the absorbed form's W_uk transposed: an einops order swapped where the key up-projection is folded into the "
     "query (the expanded form and the prefill, which read W_kvb directly, are right)", "mla_absorbed"),
    ("router_bias_in_weights", Knobs(router_bias_in_weights=True),
     "the sigmoid router's bias, which should only select the experts, also enters their weights",
     "DeepSeek-V3 / Kimi's aux-loss-free bias added to the scores once, used for both the top-k and the gates",
     "router_bias"),
    ("latent_norm_padded", Knobs(latent_norm_width=128),
     "the latent MoE's RMSNorm averages over the latent padded to 128 lanes, not its true width",
     "a norm over a lane-padded buffer (K3's latent 3584 in 4096 lanes: the mean divided by 4096)", "latent"),
    ("res_one_block_short", Knobs(res_blocks_short=1),
     "the attention-residual depth mixtures leave out the newest finished block",
     "an off-by-one in the block count of Kimi K3's attention residuals (the mixture over one block too few)",
     "attn_res"),
    ("topk_renormalized", Knobs(topk_renormalized=True), "the reported top-k logprobs are renormalised over the k ids",
     "a server that returns top-k log-softmax over the top-k instead of the vocabulary (generate() only)"),
    ("topk_ids_swapped", Knobs(topk_ranks_swapped=True), "ranks 2 and 3 of the reported top-k carry each other's ids",
     "top-k ids and values gathered through two different sorts (generate() only: the token and rank 1 are "
     "right)"),
))

BY_NAME = {f.name: f for f in CATALOGUE}
ALL_FAULTS = tuple(f.name for f in CATALOGUE)  # the catalogue's order: the names the engine accepts
FAULTS = tuple(f.name for f in CATALOGUE if f.where == "kernel")  # those of the decode step


def knobs(fault: str | None) -> Knobs:
    """The knobs of a fault by name (None: the faithful engine's)."""
    return Knobs() if fault is None else BY_NAME[fault].knobs


# Faults of one family's layers: what the model needs (a description and the Config test); the engine refuses a
# fault whose model lacks it
MODEL_NEEDS = {"moe": ("a MoE model", lambda c: c.family == "moe"),
               "sliding": ("sliding-window layers (Gemma 2/3, gpt-oss)", lambda c: "sliding" in c.layer_kinds),
               "softcap": ("an attention soft-cap (Gemma 2)", lambda c: bool(c.attn_softcap)),
               "sinks": ("attention sinks (gpt-oss)", lambda c: c.attn_sinks),
               # the fault brings MXFP4 experts (engines.megakernel.mxfp4), which need weights MXFP4 holds exactly
               "mxfp4": ("MXFP4 experts (gpt-oss)", lambda c: c.expert_act == "gptoss"),
               "recurrent": ("Gated DeltaNet or Kimi Delta Attention layers (Qwen3-Next, Qwen3.8, Kimi Linear, K3)",
                             lambda c: bool({"gdn", "kda"} & set(c.layer_kinds))),
               "kda": ("Kimi Delta Attention layers (Kimi Linear, K3)", lambda c: "kda" in c.layer_kinds),
               "router_bias": ("a sigmoid router with a selection bias (DeepSeek-V3, Kimi)",
                               lambda c: c.family == "moe" and c.router == "sigmoid"),
               "latent": ("a latent MoE (Kimi K3)", lambda c: bool(c.moe_latent) and c.moe_latent_style == "k3"),
               "attn_res": ("attention residuals (Kimi K3)", lambda c: bool(c.attn_res_block)),
               "nope": ("NoPE full-attention layers (Muse Spark)", lambda c: c.nope_full),
               "mla": ("multi-head latent attention layers (Kimi Linear, K3)", lambda c: "mla" in c.layer_kinds),
               # the fault brings the absorbed MLA form (--engine-option mla=absorbed)
               "mla_absorbed": ("multi-head latent attention layers (Kimi Linear, K3)",
                                lambda c: "mla" in c.layer_kinds)}
# low_norm needs what recurrent needs: a config cannot say which heads' norms are small, the weights do (SHOWS_WITH)
MODEL_NEEDS["low_norm"] = MODEL_NEEDS["recurrent"]
SHOWS_WITH = {"": "any prompt", "moe": "MoE models",
              "sliding": "models with sliding-window layers, contexts past the window",
              "softcap": "models with an attention soft-cap (Gemma 2)",
              "sinks": "models with attention sinks (gpt-oss)",
              "mxfp4": "MXFP4 experts (gpt-oss; the fault builds the engine with --engine-option experts=mxfp4)",
              "recurrent": "models with Gated DeltaNet or Kimi Delta Attention layers",
              "kda": "models with Kimi Delta Attention layers (Kimi Linear, K3)",
              "low_norm": "GDN or KDA heads whose q or k norm is within a few times sqrt(1e-6) (a near-dead head)",
              "router_bias": "MoE models with a sigmoid router's selection bias (DeepSeek-V3, Kimi)",
              "latent": "a latent MoE (Kimi K3)", "attn_res": "attention residuals (Kimi K3)",
              "nope": "models with NoPE full-attention layers (Muse Spark)",
              "mla": "models with multi-head latent attention layers (Kimi Linear, K3)",
              "mla_absorbed": "models with MLA layers (the fault builds the engine with --engine-option mla=absorbed)",
              "batch": "batch > 1, rows at different positions",
              "tiles": "contexts past 128 tokens",
              "refill": "more prompts than rows, finishing at different steps (refills of two or more rows)",
              "shrink": "rows finishing at different steps, the live ones not first",
              "prefix": "prompts sharing a prefix whose length is not a power of two",
              "bf16": "bfloat16 only", "bf16 long": "bfloat16, contexts past 256 tokens"}


def rows() -> list[dict]:
    """The catalogue as the engine's fault table rows (engines.base.Engine.fault_catalogue), in its order."""
    return [{"name": f.name, "what": f.what, "stands_for": f.stands_for, "shows_with": SHOWS_WITH[f.needs]}
            for f in CATALOGUE]


def stale_feedback(decode, shrink):
    """The stale_feedback fault around a decode step and its batch shrink (a "loop" knob)."""
    prev: dict[str, np.ndarray] = {}

    def step(ids, positions, state, k, want_logits):
        ids = np.asarray(ids)
        last = prev.get("ids")
        fed = last if last is not None and last.shape == ids.shape else ids
        prev["ids"] = ids.copy()
        return decode(fed, positions, state, k, want_logits)

    def shrink_rows(state, keep):
        if prev.get("ids") is not None:
            prev["ids"] = prev["ids"][np.asarray(keep)]
        return shrink(state, keep)

    return step, shrink_rows
