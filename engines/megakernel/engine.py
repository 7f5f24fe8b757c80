"""MegakernelEngine: the engine protocol over the one-pallas_call decode step."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from engines import compile_cache
from engines.base import (
    Capabilities,
    Engine,
    EngineOptions,
    Forced,
    Generation,
    PathLog,
    Recipe,
    Scored,
    check_prompts,
    flag_option,
    next_pow2,
    source_fingerprint,
)
from engines.errors import ModelError, UnsupportedModel
from engines.loop import (
    MIN_PREFILL_BUCKET,
    MIN_WINDOW,
    Steps,
    attention_window,
    forced_all,
    forced_from_decode,
    greedy_all,
)
from engines.megakernel import recurrent, replay
from engines.megakernel.budget import budget
from engines.megakernel.checks import check_options, round_points
from engines.megakernel.faults import ALL_FAULTS, BY_NAME, FAULTS, knobs, rows, stale_feedback
from engines.megakernel.kernel import KernelSpec, decode_layers, hbm_arrays
from engines.megakernel.programs import ATTN_TILE, _programs
from engines.megakernel.spec import cache_shapes, norm_weight, rope_arrays
from engines.megakernel.tpu import DEFAULT_CHIP, lower, race_checks, races_found, tpu_interpret_params
from engines.megakernel.verify import VERIFY_FAULTS
from engines.weights import Weights

F32 = jnp.float32
MAX_BATCH = 8  # the kernel's rows per call (each row at its own position)
# bfloat16 mode as declared to the judge by default: bf16 matrices and matmul inputs, f32 accumulation, and the router,
# the residual stream and the KV cache in float32 (the norms and the router bias are float32 in every recipe);
# Qwen3-Next's shared-expert gate vector float32 too. kv_cache, residual and rounds move it to the public kernels'.
BF16_RECIPE = Recipe(f32_weights=("router", "shared_gate"))


class MegakernelEngine(Engine):
    """dtype "float32" (all f32) or "bfloat16" (bf16 weights, f32 accumulation and residual stream, the KV cache f32
    or, with kv_cache="bfloat16", bf16: the TPU recipe). fault: one of the catalogue's (faults.py), a self-test aid."""

    capabilities = Capabilities(logits=True, taps=True, forced_path="decode", routing=True)
    max_batch = MAX_BATCH
    streams_results = True  # continuous batching (engines.stream.greedy_stream)
    faults = ALL_FAULTS
    options = ("batch_invariant", "chip", "experts", "interpret", "kv_cache", "mla", "residual", "rounds")
    paths = ("prefill_split", "refill", "refill_group", "shrink", "finish_mid_batch", "stop", "shared_prefix",
             "shared_prefix_unaligned", "multi_tile", "teacher_forced")

    @classmethod
    def fault_catalogue(cls) -> list[dict]:
        return rows()

    @classmethod
    def create(cls, model, options: EngineOptions) -> MegakernelEngine:
        opt = lambda k: str(options.extra[k]) if options.extra.get(k) else None  # noqa: E731 (None: the default)
        return cls(model.weights, options.dtype, fault=options.fault,
                   batch_invariant=flag_option(options.extra, "batch_invariant"),
                   kv_cache=opt("kv_cache") or "float32", chip=opt("chip") or DEFAULT_CHIP,
                   interpret=opt("interpret") or "generic", experts=opt("experts"), mla=opt("mla"),
                   rounds=opt("rounds"), residual=opt("residual") or "float32")

    def __init__(self, weights: Weights, dtype: str = "float32", fault: str | None = None,
                 interpret: str = "generic", fault_layer: int | None = None, n_buffers: int = 2,
                 batch_invariant: bool = False, chip: str = DEFAULT_CHIP, kv_cache: str = "float32",
                 experts: str | None = None, verify_fault: str | None = None, mla: str | None = None,
                 rounds: str | None = None, residual: str = "float32"):
        """batch_invariant: every generate() call has one shape whatever the batch (8 rows always, each
        prompt prefilled alone, a fixed attention tile, no shared prefix), so a prompt's tokens and logprobs
        are bitwise the same alone or batched (what vLLM's VLLM_BATCH_INVARIANT=1 promises); slower.
        chip: the TPU generation whose VMEM the kernel is built to (engines.megakernel.budget): a model whose largest
        decode step cannot fit it is refused, and every step passes its budget to Mosaic as the VMEM limit.
        kv_cache: the KV cache's storage in bfloat16 mode (declared in the recipe, so the judge rounds K/V the same
        way); a float32 engine, the float32 build of a bf16 run included, keeps float32.
        experts: "mxfp4" keeps the routed experts in MXFP4 in HBM, dequantised in VMEM (engines.megakernel.mxfp4);
        None: "dense", or "mxfp4" under a fault of MXFP4's own (the fault brings the format it breaks).
        mla: an MLA layer's form (spec.MLA_FORMS); None: "expanded", or a fault's own form.
        rounds: where bfloat16 mode rounds besides its matmul inputs, declared in the recipe: "public" (the
        public TPU kernels' points, engines.recipe.public_rounds), a comma list of engines.recipe.ROUND_POINTS, or None.
        residual: what bfloat16 mode rounds the residual stream to after each add (the public Kimi and Qwen kernels:
        bfloat16), declared in the recipe; float32 mode keeps float32.
        verify_fault: one of engines.megakernel.verify.VERIFY_FAULTS, for the speculative engine's verify step."""
        needs = BY_NAME[fault].needs if fault in ALL_FAULTS else ""
        experts, mla = experts or ("mxfp4" if needs == "mxfp4" else "dense"), mla or (
            "absorbed" if needs == "mla_absorbed" else "expanded")
        check_options(weights.config, dtype, fault, interpret, kv_cache, experts, chip, mla, residual)
        kv_cache, residual = (kv_cache, residual) if dtype == "bfloat16" else ("float32", "float32")  # the bf16 recipe
        rounds = round_points(weights.config, dtype, rounds)
        c = self.config = weights.config
        self.name = "megakernel"
        self.chip, self.experts = chip, experts
        # where the kernel rounds: the declared bf16 recipe's settings (float32: nothing), one value every program takes
        self.numerics = numerics = Recipe(kv_cache=kv_cache, residual=residual, mla=mla, rounds=rounds)
        largest = KernelSpec(c, MAX_BATCH, ATTN_TILE, MIN_WINDOW if batch_invariant else ATTN_TILE, want_taps=True,
                             experts=experts, numerics=numerics)
        refused = budget(largest, dtype, chip).refusal(f"the megakernel's decode step for {c.name} in {dtype}")
        if refused:
            raise UnsupportedModel(refused)
        compile_cache.enable()
        self.dtype, self.fault, self.weights_sha256 = dtype, fault, weights.sha256
        self.knobs = kn = knobs(fault)  # what the fault changes; the code below reads these, never its name
        if verify_fault is not None:
            self.knobs = kn = replace(kn, **VERIFY_FAULTS[verify_fault][0].set())
        self.verify_fault = verify_fault
        self.recipe = replace(numerics, f32_weights=BF16_RECIPE.f32_weights) if dtype != "float32" else None
        self.fault_layer = c.n_layers // 2 if fault_layer is None else fault_layer
        self.n_buffers, self.batch_invariant = n_buffers, batch_invariant
        round_norms = numerics.rounds_at("norm_weights")  # Muse Spark's bf(1 + w), in the HBM copies and the final norm
        try:
            self.hbm = hbm_arrays(weights, dtype, experts, mla, kn.mla_uk_transposed, round_norms)
        except ValueError as e:  # experts=mxfp4 on weights MXFP4 cannot hold
            raise ModelError(f"--engine-option experts=mxfp4: {e}") from None
        self.embed = jnp.asarray(weights.arrays["embed"], jnp.dtype(dtype))
        head = weights.arrays["embed"] if c.tie_embeddings else weights.arrays["lm_head"]
        self.head_t = jnp.asarray(np.ascontiguousarray(head.T), jnp.dtype(dtype))  # [D, V]
        self.final_norm = jnp.asarray(norm_weight(c, "final_norm", weights.arrays["final_norm"],
                                                     round_norms)[None, :], F32)
        self.rope = rope_arrays(c)  # below: the decode step's own tables (the prefill is never faulted)
        faulted = kn.rope_theta_factor != 1.0 or kn.nope_rotated
        self.rope_decode = rope_arrays(c, kn.rope_theta_factor, kn.nope_rotated) if faulted else self.rope
        # Weights go into the jitted functions as arguments, never as closure constants: a constant is baked into
        # every compiled shape (540 MB each for SmolLM2), which ran the machine out of memory after a few shapes.
        self.w = {"hbm": self.hbm, "embed": self.embed, "head_t": self.head_t,
                  "final_norm": self.final_norm, "rope": self.rope, "rope_decode": self.rope_decode}
        # the host-side faults leave every jitted program as the faithful engine's, and share it
        programs = _programs(c, kn.only("kernel"), self.fault_layer, n_buffers, interpret, batch_invariant,
                             chip, experts, numerics)
        self.interpret, self._programs = programs.interpret, programs  # one InterpretParams per spec, as it uses
        j = programs.jitted  # the jitted steps, by name (shared per spec)
        self._prefill, self._extend, self._prefix_kv = j["_prefill"], j["_extend"], j["_prefix_kv"]
        self._score, self._prefill_routes = j["_score"], j["_prefill_routes"]
        self._gather, self._put, self._decode, self._verify = j["_gather"], j["_put"], j["_decode"], j["_verify"]
        # a head fault's own head program, over the kernel programs of its kernel knobs (a head fault keyed the
        # kernel's programs too, and every one of its shapes was traced again: 54 s of CI for topk_ids_swapped)
        self._head = _programs(c, kn.only("kernel", "head"), self.fault_layer, n_buffers, interpret, batch_invariant,
                               chip, experts, numerics).jitted["_head"]
        self._prefix: tuple[tuple[int, ...], tuple] | None = None  # (prefix ids, its K/V [L, 1, K, P, hd])
        self.share_prefix = True  # False: every row prefilled in full (the benchmark's ablation)
        self._paths = PathLog()
        if batch_invariant:  # one shape whatever the batch: every prompt prefilled alone, no shrink, no shared prefix
            self.paths = ("refill", "finish_mid_batch", "stop", "multi_tile", "teacher_forced")

    def lower_decode(self, batch: int, window: int, want_taps: bool = False, block: int = 1):
        """The decode step (block > 1: the verify step) at `batch` rows over a `window`-slot cache, lowered for TPU
        on this host (engines.megakernel.tpu.Lowered): what Mosaic would be handed, and its budget."""
        c = self.config
        spec = replace(self._programs._spec(batch, window, want_taps, window, self.dtype, block), interpret=False)
        sd = lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype)  # noqa: E731
        kv = jnp.dtype(self.kv_cache)
        k_cache, v_cache = (jax.ShapeDtypeStruct(s, kv) for s in cache_shapes(c, batch, window, self.mla))
        x = jax.ShapeDtypeStruct((batch * block, c.hidden), F32)
        pos = jax.ShapeDtypeStruct((batch * block,), jnp.int32)
        rec = tuple(jax.ShapeDtypeStruct(s, F32) for s in recurrent.state(c, batch))
        return spec, lower(lambda h, r, x, p, kc, vc, *st: decode_layers(spec, h, x, p, kc, vc, r, st),
                           jax.tree.map(sd, self.hbm), jax.tree.map(sd, self.rope_decode), x, pos, k_cache, v_cache,
                           *rec)

    def path_log(self) -> PathLog:
        return self._paths

    def self_checks(self) -> list[dict]:
        return race_checks(self.interpret)

    def compiled_decode_shapes(self) -> int:
        """How many decode-kernel programs (one per rows, slots, window, taps) this engine's spec has compiled."""
        return self._decode._cache_size()

    # ---- the protocol --------------------------------------------------------------------------
    # the declared recipe's settings, read from the one value the kernel's programs take
    kv_cache = property(lambda self: self.numerics.kv_cache)
    residual = property(lambda self: self.numerics.residual)
    mla = property(lambda self: self.numerics.mla)
    rounds = property(lambda self: self.numerics.rounds)

    @property
    def fingerprint(self) -> str:
        """Source, jax versions and static spec (engines.base.source_fingerprint)."""
        return source_fingerprint(Path(__file__).parent, {
            "engine": self.name, "dtype": self.dtype, "fault": self.fault, "fault_layer": self.fault_layer,
            "n_buffers": self.n_buffers, "interpret": str(self.interpret), "attn_tile": ATTN_TILE,
            "max_batch": MAX_BATCH, "share_prefix": self.share_prefix,
            "batch_invariant": self.batch_invariant, "chip": self.chip, "kv_cache": self.kv_cache,
            "experts": self.experts, "mla": self.mla, "rounds": self.rounds, "residual": self.residual,
            "verify_fault": self.verify_fault,
            "weights": self.weights_sha256})

    def _check(self, prompts, max_new):
        check_prompts(prompts, self.config.vocab_size, self.config.max_context, max_new)

    def score(self, seqs: Sequence[Sequence[int]], want_taps: bool = False) -> list[Scored]:
        """Teacher-forced logits through the engine's XLA prefill path (the kernel is decode-only;
        use decode_forced for kernel logits at given tokens)."""
        check_prompts(seqs, self.config.vocab_size, self.config.max_context + 1, 1)
        out = []
        for s in seqs:
            T = len(s)
            tokens = np.zeros((1, next_pow2(T, MIN_PREFILL_BUCKET)), np.int32)
            tokens[0, :T] = s
            logits, taps = self._score(self.w, jnp.asarray(tokens), want_taps=want_taps)
            out.append(Scored(np.asarray(logits[0, :T]), np.asarray(taps[:, 0, :T]) if want_taps else None))
        return out

    def _prefill_step(self, tokens, lengths, slots, k, want_logits):
        x, state = self._prefill(self.w, jnp.asarray(tokens), jnp.asarray(lengths), slots=slots)
        return (*self._head(self.w, x, k=k, want_logits=want_logits, decode=False), state)

    def _extend_step(self, prefix, tokens, lengths, slots, k, want_logits):
        """Prefill only the rows' suffixes over a prefix they all share (lm-eval's fixed few-shot
        exemplars), whose K/V is computed once (XLA, like every prefill here) and kept."""
        if self._prefix is None or self._prefix[0] != prefix:
            P = len(prefix)
            ptoks = np.zeros((1, next_pow2(P, MIN_PREFILL_BUCKET)), np.int32)
            ptoks[0, :P] = prefix
            kc, vc, *rec = self._prefix_kv(self.w, jnp.asarray(ptoks), jnp.asarray([P], np.int32))
            keep = ptoks.shape[1] if self.knobs.prefix_kept_padded else P  # the fault: the bucket, not the length
            self._prefix = (prefix, (kc[:, :, :, :keep], vc[:, :, :, :keep], *rec))
        x, state = self._extend(self.w, self._prefix[1], jnp.asarray(tokens), jnp.asarray(lengths), slots=slots)
        return (*self._head(self.w, x, k=k, want_logits=want_logits, decode=False), state)

    def _decode_step(self, ids, positions, state, k, want_logits):
        window = attention_window(positions, state[0].shape[3])
        tiles = window // min(MIN_WINDOW if self.batch_invariant else ATTN_TILE, window)
        self._paths.shape("decode_window", window)
        self._paths.shape("attention_tiles", tiles)
        if tiles >= 2:
            self._paths.hit("multi_tile")
        x, state, _ = self._decode(self.w, jnp.asarray(ids), jnp.asarray(positions), state, window=window)
        return (*self._head(self.w, x, k=k, want_logits=want_logits, decode=True), state)

    def _shrink_step(self, state, keep):
        if self.knobs.shrink_keeps_first:  # the first rows kept, not the live ones
            keep = np.arange(len(keep), dtype=np.int32)
        return self._gather(state, jnp.asarray(keep))

    def _insert_step(self, state, rows, where, src, batch, slots):
        """Rows src of a fresh prefill's cache (prefilled with these slots) into batch rows where."""
        if state is None:
            c = self.config
            state = (*[jnp.zeros(s, jnp.dtype(self.kv_cache)) for s in cache_shapes(c, batch, slots, self.mla)],
                     *[jnp.zeros(s, F32) for s in recurrent.state(c, batch)])
        elif self.knobs.refill_shifted:  # a refill of m >= 2 rows: each gets the next prompt's cache
            m = len(np.unique(src))
            src = np.concatenate([np.roll(src[:m], -1), src[m:]]).astype(np.int32)
        return self._put(state, rows, jnp.asarray(where), jnp.asarray(src))

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                 stop_ids: Sequence[int] = (), top_k: int = 5, want_logits: bool = False,
                 stop_check=None, stop_strings: Sequence[str] = (),
                 on_result=None) -> list[Generation]:
        self._check(prompts, max_new_tokens)
        return greedy_all(self.steps(), prompts, max_new_tokens, stop_ids, top_k, want_logits, MAX_BATCH,
                          stop_check=stop_check, on_result=on_result, invariant=self.batch_invariant, log=self._paths)

    def steps(self) -> Steps:
        """The stepped programs generate() drives (engines.loop.Steps), its fault included: a fresh bundle per
        generation (the stale_feedback fault keeps the previous step's ids in it)."""
        decode, shrink = self._decode_step, self._shrink_step
        if self.knobs.stale_feedback:
            decode, shrink = stale_feedback(decode, shrink)
        return Steps(self._prefill_step, decode, self._extend_step if self.share_prefix else None,
                     self._insert_step, shrink)

    def decode_forced(self, prompts: Sequence[Sequence[int]],
                      continuations: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """Prefill (XLA), then every continuation token through the kernel; logits [N, V] per row."""
        self._check([list(p) + list(x) for p, x in zip(prompts, continuations)], 1)
        return forced_all(Steps(self._prefill_step, self._decode_step, shrink=self._shrink_step), prompts,
                          continuations, MAX_BATCH, log=self._paths)

    def forced_topk(self, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]], k: int = 5,
                    want_logits: bool = False) -> list[Forced]:
        """Every continuation token scored by a kernel step (engines.loop.forced_from_decode)."""
        return forced_from_decode(self.decode_forced, prompts, continuations, k, want_logits)

    def step_taps(self, prompts: Sequence[Sequence[int]], next_ids: Sequence[int], decoded: int = 0) -> np.ndarray:
        """Prefill each prompt but its last `decoded` tokens (XLA), feed those by kernel steps, then run ONE
        kernel step on next_ids with taps on, every step over the window generation would read.
        Returns [rows, L, D]: the residual stream after each layer at the new position."""
        return replay.step_taps(self, prompts, next_ids, decoded)

    def forced_routing(self, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]], k: int = 5,
                       want_logits: bool = False) -> list[Forced]:
        """forced_topk's path (the kernel's steps, taps on) with each MoE layer's choice read back (Forced.routing)."""
        return replay.forced_routing(self, prompts, continuations, k, want_logits)

__all__ = ["MegakernelEngine", "FAULTS", "races_found", "tpu_interpret_params"]
