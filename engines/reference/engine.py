"""ReferenceEngine: the engine protocol over engines.reference.model (jit, bucketed shapes)."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from functools import lru_cache, partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from engines import compile_cache
from engines.base import (
    DTYPES,
    Capabilities,
    Engine,
    EngineOptions,
    Forced,
    Generation,
    PathLog,
    Recipe,
    Scored,
    check_prompts,
    next_pow2,
    source_fingerprint,
)
from engines.config import RECURRENT
from engines.errors import ModelError
from engines.lazy import as_lazy
from engines.loop import (
    MIN_PREFILL_BUCKET,
    Steps,
    cache_slots,
    forced_all,
    forced_from_decode,
    greedy_all,
)
from engines.reference import model, sharding
from engines.reference.scoring import PrefillScoring, forced_experts
from engines.weights import Weights

MAX_BATCH = 32  # rows per device call; larger prompt lists run in chunks
# The conditioning witness holds a float64 copy of the weights while a diff runs: at most this much
# (smollm2-135m: 1.1 GB; a model beyond it gets no witness, and diff says so).
WITNESS_MAX_BYTES = 8 * 2**30
PER_LAYER_SKIP = ("embed", "lm_head", "final_norm", "res_out")
# Kept in float32 in every mode, like the norms: they are added, not multiplied into a matmul.
F32_ARRAYS = ("router_bias", "bq", "bk", "bv", "bo", "sinks", "e_gate_b", "e_up_b", "e_down_b", "gdn_A_log",
              "gdn_dt_bias", "kda_A_log", "kda_dt_bias", "res_attn", "res_mlp", "res_out",
              "res_gate_attn", "res_gate_mlp")


def _device_dtype(name: str, dtype: str, f32_weights: tuple[str, ...] = ()):
    return jnp.float32 if name.endswith("norm") or name in F32_ARRAYS + f32_weights else jnp.dtype(dtype)


def device_params(weights: Weights, dtype: str, f32_weights: tuple[str, ...] = ()) -> dict:
    """Weights on the device in dtype (norm weights, biases and sinks stay float32).

    Stacked per-layer arrays become Python lists of per-layer arrays: XLA on CPU copies a slice of
    a stacked [L, ...] parameter before a matmul, which made decode 13x slower than reading
    separate arrays (29 ms vs 2.2 ms for 30 layers of 576x1536, measured in development).
    """
    out: dict = {}
    for k, v in weights.arrays.items():
        dt = _device_dtype(k, dtype, f32_weights)
        out[k] = (jnp.asarray(v, dtype=dt) if k in PER_LAYER_SKIP
                  else [jnp.asarray(layer, dtype=dt) for layer in v])
    return out


@lru_cache(maxsize=16)
def _programs(c, m, r) -> dict:
    """The jitted steps for one (config, mesh, recipe), shared by every engine built for them: they read nothing else
    (weights and caches are arguments), and a new engine would otherwise trace them all again (smollm2: 6 s
    for a tiny generate + forced + score on a second engine, 0.x s with them shared)."""
    R = ReferenceEngine
    return {
        "_score": jax.jit(partial(R._score_impl, c, r, m), static_argnames="want_taps"),
        # Every step is two programs: the model (keyed by shapes) and the head (log-softmax, top-k; keyed
        # by k and want_logits), so a caller's k or want_logits never recompiles the model. On a mesh the
        # steps' caches are sharded and their logits replicated (sharding.constrain_step).
        "_prefill": jax.jit(sharding.constrain_step(partial(R._prefill_impl, c, r), m), donate_argnums=(3, 4)),
        "_decode": jax.jit(sharding.constrain_step(partial(R._decode_impl, c, r), m), donate_argnums=(3, 4)),
        "_head": jax.jit(partial(R._pick, mesh=m), static_argnames=("k", "want_logits")),
        "_grow": jax.jit(partial(R._grow_impl, c), static_argnames="slots"),
        "_extend": jax.jit(sharding.constrain_step(partial(R._extend_impl, c, r), m), donate_argnums=(4, 5)),
        "_seed": jax.jit(partial(R._seed_impl, c), static_argnames=("batch", "slots")),
        "_gather": jax.jit(lambda kc, vc, keep: ([x[keep] for x in kc], [x[keep] for x in vc])),
        "_put": jax.jit(lambda kc, vc, rk, rv, where, src: (
            [x.at[where].set(r[src]) for x, r in zip(kc, rk)], [x.at[where].set(r[src]) for x, r in zip(vc, rv)]),
            donate_argnums=(0, 1)),
        "_f64_forward": jax.jit(partial(R._float64_impl, c, r)),
        "_score_at": jax.jit(partial(R._score_at_impl, c, r), static_argnames=("k", "fresh")),
    }


class ReferenceEngine(PrefillScoring, Engine):
    """Pure-JAX reference. Its KV cache holds the slots the rows have reached (engines.loop.cache_slots),
    not the loop's full prompt + max_new, and grows by buckets during decode: a decode step's attention
    reads every slot of its cache, so an oversized cache is read for nothing (batch 32 at 1,000 tokens:
    528 ms a step with a 2,048-slot cache read up to a 1,024 window, measured with benchmarks/decode.py).
     dtype "float32" or "bfloat16": the weights' dtype; matmul inputs are
    rounded to it, everything else (residual, KV cache, norms, softmax, accumulation) is float32
    (see model.py: the bf16 recipe engines declare)."""

    capabilities = Capabilities(logits=True, taps=True, forced_path="decode")
    no_float32_build = "the reference's float32 build is the judge itself"
    max_batch = MAX_BATCH
    streams_results = True  # continuous batching (engines.stream.greedy_stream)
    options = ("mesh",)  # --engine-option mesh=tp=2,dp=2: the weights on a JAX mesh (engines.reference.sharding)
    paths = ("prefill_split", "refill", "refill_group", "shrink", "finish_mid_batch", "stop", "shared_prefix",
             "shared_prefix_unaligned", "teacher_forced")

    @classmethod
    def create(cls, model, options: EngineOptions) -> ReferenceEngine:
        return cls(model.weights, options.dtype, mesh=options.extra.get("mesh") or None)

    def __init__(self, weights: Weights, dtype: str = "float32", mesh: str | None = None,
                 recipe: Recipe | None = None):
        """mesh: "tp=2,dp=2"-style axis sizes: the weights go onto a JAX mesh (engines.reference.sharding).
        recipe: bfloat16 mode's roundings (engines.base.Recipe; default Recipe(): every matrix in bf16, the
        router included): the judge runs an engine's declared recipe with it."""
        if dtype not in DTYPES:
            raise ModelError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
        self.name = "reference"
        compile_cache.enable()
        self.config = weights.config
        self.dtype = dtype
        self.recipe = (recipe or Recipe()) if dtype == "bfloat16" else None
        f32_weights = self.recipe.f32_weights if self.recipe else ()
        self.weights_sha256 = weights.sha256
        self.mesh = None
        self._in = jnp.asarray  # host arrays into the jitted steps
        if mesh:
            self.mesh = sharding.make_mesh(sharding.parse_mesh(mesh), weights.config)
            self._in = partial(sharding.host_input, mesh=self.mesh)
        if self.mesh is not None:  # each device gets its slices (from the files when the weights are lazy)
            self.params = sharding.place_lazy(as_lazy(weights.arrays), self.mesh,
                                              partial(_device_dtype, dtype=dtype, f32_weights=f32_weights),
                                              PER_LAYER_SKIP)
        else:
            self.params = device_params(weights, dtype, f32_weights)
        self._weights = weights
        p = _programs(self.config, self.mesh, self.recipe)  # the jitted steps, by name (shared per spec)
        self._score, self._prefill, self._decode, self._head = p["_score"], p["_prefill"], p["_decode"], p["_head"]
        self._grow, self._extend, self._seed, self._gather = p["_grow"], p["_extend"], p["_seed"], p["_gather"]
        self._put, self._f64_forward, self._score_at = p["_put"], p["_f64_forward"], p["_score_at"]
        self._prefix: tuple[tuple[int, ...], tuple] | None = None  # (prefix ids, its per-layer K/V)
        self._p64: dict | None = None  # float64 weights, made on the first float64_logits call
        self.share_prefix = True  # False: every row prefilled in full (the benchmark's ablation)
        self._paths = PathLog()

    def path_log(self) -> PathLog:
        return self._paths

    # ---- jitted pieces -------------------------------------------------------------------------
    @staticmethod
    def _score_impl(c, r, mesh, p, tokens, want_taps, experts=None):
        B, T = tokens.shape
        positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
        kc, vc = model.empty_cache(c, B, T, mla_form=r.mla if r else "expanded")
        logits, _, _, extra = model.forward(p, c, tokens, positions, kc, vc, want_taps, fresh=True, recipe=r,
                                            experts=experts)
        taps, routing = extra if want_taps else (None, None)
        return (sharding.replicate(logits, mesh), sharding.replicate(taps, mesh),
                sharding.replicate(routing, mesh) if routing is not None else None)

    @staticmethod
    def _pick(logits, k, want_logits, mesh=None):
        logp = jax.nn.log_softmax(logits, axis=-1)
        top_v, top_i = jax.lax.top_k(logp, k)
        nxt = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        out = nxt, top_i, top_v, (logits if want_logits else None)
        return tuple(sharding.replicate(x, mesh) for x in out)

    @classmethod
    def _prefill_impl(cls, c, r, p, tokens, lengths, kc, vc):
        return cls._extend_impl(c, r, p, tokens, lengths, 0, kc, vc, fresh=True)

    @classmethod
    def _extend_impl(cls, c, r, p, tokens, lengths, start, kc, vc, fresh=False):
        """Prefill suffixes [B, T] at positions start.. over a cache already holding the prefix
        (fresh: start is 0 and the cache is empty). Returns each row's last logits [B, V] and the caches."""
        B, T = tokens.shape
        positions = start + jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
        last, kc, vc, _ = model.forward(p, c, tokens, positions, kc, vc, logit_index=lengths - 1, fresh=fresh,
                                        recipe=r, lengths=lengths)
        return last, kc, vc

    @staticmethod
    def _seed_impl(c, pk, pv, batch, slots):
        """Per layer [batch, K, slots, hd] caches whose first slots hold the prefix's K/V [1, K, P, hd]; a
        recurrent layer's state after the prefix, copied to every row."""
        def grow(layer, x):
            if c.kind(layer) in RECURRENT:
                return jnp.broadcast_to(x, (batch, *x.shape[1:]))
            return jnp.zeros((batch, x.shape[1], slots, x.shape[3]), x.dtype).at[:, :, :x.shape[2]].set(
                jnp.broadcast_to(x, (batch, *x.shape[1:])))
        return [grow(i, x) for i, x in enumerate(pk)], [grow(i, x) for i, x in enumerate(pv)]

    @staticmethod
    def _grow_impl(c, kc, vc, slots):
        """The attention and MLA layers' caches padded to slots (a recurrent layer's state has no slots)."""
        def pad(layer, x):
            return x if c.kind(layer) in RECURRENT else jnp.pad(x, ((0, 0), (0, 0), (0, slots - x.shape[2]), (0, 0)))
        return [pad(i, x) for i, x in enumerate(kc)], [pad(i, x) for i, x in enumerate(vc)]

    @classmethod
    def _decode_impl(cls, c, r, p, tokens, positions, kc, vc):
        logits, kc, vc, _ = model.forward(p, c, tokens[:, None], positions[:, None], kc, vc, recipe=r)
        return logits[:, 0], kc, vc

    @staticmethod
    def _score_at_impl(c, r, p, tokens, start, at, nxt, kc, vc, k, fresh):
        """Tokens [B, T] at positions start.. (over a cache holding the prefix, or fresh from 0): at the positions
        `at` [B, S], the top-k log-softmax (ids, values [B, S, k]) and that of the next given token nxt [B, S]."""
        B, T = tokens.shape
        positions = start + jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
        logits = model.forward(p, c, tokens, positions, kc, vc, logit_index=at, fresh=fresh, recipe=r)[0]
        logp = jax.nn.log_softmax(logits, axis=-1)
        top_v, top_i = jax.lax.top_k(logp, k)
        return top_i, top_v, jnp.take_along_axis(logp, nxt[:, :, None], axis=-1)[..., 0]

    @property
    def fingerprint(self) -> str:
        """Source, jax versions and static spec (engines.base.source_fingerprint)."""
        from pathlib import Path

        return source_fingerprint(Path(__file__).parent, {
            "engine": self.name, "dtype": self.dtype, "max_batch": MAX_BATCH, "share_prefix": self.share_prefix,
            "recipe": self.recipe.describe() if self.recipe else None,
            "weights": self.weights_sha256, "mesh": None if self.mesh is None else dict(self.mesh.shape)})

    def placement(self) -> dict | None:
        if self.mesh is None:
            return None
        read = self._weights.arrays.bytes_read if self._weights.lazy else None
        return {**sharding.placement(self.params, self.mesh), "lazy": self._weights.lazy, "bytes_read": read}

    # ---- the protocol --------------------------------------------------------------------------
    def score(self, seqs: Sequence[Sequence[int]], want_taps: bool = False,
              experts: Sequence[np.ndarray] | None = None) -> list[Scored]:
        """experts (a routing replay): per sequence [M, T, k], each MoE layer's experts at each token, forced; the
        Scored's routing_gaps then say how far from its own choice each forced set is (model.forced_gap)."""
        c = self.config
        check_prompts(seqs, c.vocab_size, c.max_context + 1, 1)
        out = []
        for n, s in enumerate(seqs):  # one row at a time: no padding, so no padding can leak into a result
            T = len(s)
            Tb = next_pow2(T, MIN_PREFILL_BUCKET)
            tokens = np.zeros((1, Tb), np.int32)
            tokens[0, :T] = s
            forced = None if experts is None else forced_experts(c, experts[n], T, Tb)
            logits, taps, routing = self._score(self.params, self._in(tokens), want_taps=want_taps or experts
                                                is not None, experts=forced)
            m, chosen = (np.asarray(routing[0][:, 0, :T]), np.asarray(routing[1][:, 0, :T])) if routing else (None,) * 2
            taps, logits = np.asarray(taps[:, 0, :T]) if want_taps else None, np.asarray(logits[0, :T])
            out.append(Scored(logits, taps, None, None, chosen, m) if forced is not None
                       else Scored(logits, taps, m.min(axis=0) if m is not None else None, m, chosen))
        return out

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                 stop_ids: Sequence[int] = (), top_k: int = 5,
                 want_logits: bool = False, stop_check=None, stop_strings: Sequence[str] = (),
                 on_result=None) -> list[Generation]:
        c = self.config
        check_prompts(prompts, c.vocab_size, c.max_context, max_new_tokens)
        if not 1 <= top_k <= c.vocab_size:
            raise ModelError(f"top_k must be in [1, {c.vocab_size}], got {top_k}")
        return greedy_all(self.steps(), prompts, max_new_tokens, stop_ids, top_k, want_logits, MAX_BATCH,
                          stop_check=stop_check, on_result=on_result, log=self._paths)

    def steps(self) -> Steps:
        """The stepped programs generate() drives (engines.loop.Steps)."""
        return Steps(self._prefill_step, self._decode_step, self._extend_step if self.share_prefix else None,
                     self._insert_step, self._shrink_step)

    def compiled_decode_shapes(self) -> int:
        """How many decode-step programs (one per rows, slots, window) this engine's spec has compiled."""
        return self._decode._cache_size()

    def decode_forced(self, prompts: Sequence[Sequence[int]],
                      continuations: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """Teacher-forced incremental decode: prefill each prompt, then feed its continuation one
        token per step through the KV cache. Returns per row logits [N, V] float32 where row j
        predicts continuation[j] from prompt + continuation[:j]."""
        c = self.config
        check_prompts([list(p) + list(x) for p, x in zip(prompts, continuations)], c.vocab_size,
                      c.max_context + 1, 1)
        return forced_all(Steps(self._prefill_step, self._decode_step, shrink=self._shrink_step), prompts,
                          continuations, MAX_BATCH, log=self._paths)

    def forced_topk(self, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]], k: int = 5,
                    want_logits: bool = False) -> list[Forced]:
        """Every continuation token scored by a decode step (engines.loop.forced_from_decode)."""
        return forced_from_decode(self.decode_forced, prompts, continuations, k, want_logits)

    def float64_logits(self, prompt: Sequence[int], track: Sequence[int]) -> np.ndarray:
        """[len(track), V]: the same math in float64 (model.float64_math, weights cast up) teacher-forced along
        prompt + track, at the positions that predict track's tokens. The judge's own distance from exact
        arithmetic (rule.py's conditioning witness); raises ModelError where it cannot run."""
        need = 8 * self._weights.n_params
        if self.mesh is not None:
            raise ModelError("the float64 witness runs on an unsharded reference only")
        if need > WITNESS_MAX_BYTES:
            raise ModelError(f"float64 weights would take {need / 2**30:.1f} GiB (> {WITNESS_MAX_BYTES / 2**30:.0f})")
        seq = list(prompt) + list(track[:-1])
        tokens = np.zeros((1, next_pow2(len(seq), MIN_PREFILL_BUCKET)), np.int32)  # causal: the padding after
        tokens[0, :len(seq)] = seq  # the sequence changes no position before it, and buckets reuse programs
        # a TPU has no float64 matmul: its host's CPU runs the float64 math (the chip's float32 transcendentals are
        # thousands of ulps off in log, softplus and tanh, which no reordering of the float32 sums shows:
        # benchmarks/results/tpu-ops-v5e.json)
        host = jax.default_device(jax.devices("cpu")[0]) if jax.default_backend() == "tpu" else nullcontext()
        with model.float64_math(), host:
            if self._p64 is None:
                self._p64 = device_params(self._weights, "float64")
            logits = self._f64_forward(self._p64, jnp.asarray(tokens))
            return np.asarray(logits[0, len(prompt) - 1:len(seq)], np.float64)

    @staticmethod
    def _float64_impl(c, r, p, tokens):
        T = tokens.shape[1]
        kc, vc = model.empty_cache(c, 1, T, jnp.float64, r.mla if r else "expanded")
        return model.forward(p, c, tokens, jnp.arange(T, dtype=jnp.int32)[None], kc, vc, fresh=True, recipe=r)[0]

    def step_taps(self, prompts: Sequence[Sequence[int]], next_ids: Sequence[int], decoded: int = 0) -> np.ndarray:
        """[rows, L, D]: the residual stream after each layer at the position of next_ids (the reference's
        one forward pass computes every position the same way, so its taps there are its decode step's, whatever
        `decoded` says: its cache holds what its forward pass computes)."""
        return np.stack([self.score([list(p) + [int(t)]], want_taps=True)[0].taps[:, -1]
                         for p, t in zip(prompts, next_ids)])

    def _prefill_step(self, tokens, lengths, slots, k, want_logits):
        kc, vc = self.new_cache(tokens.shape[0], cache_slots(tokens.shape[1], slots))
        logits, kc, vc = self._prefill(self.params, self._in(tokens), self._in(lengths), kc, vc)
        return (*self._head(logits, k=k, want_logits=want_logits), (kc, vc))

    def _extend_step(self, prefix, tokens, lengths, slots, k, want_logits):
        """Prefill only the suffixes; the shared prefix's K/V is computed once and kept (one entry:
        lm-eval's few-shot prefix is the same for every item of a task)."""
        pk, pv = self.prefix_cache(prefix)
        need = max(len(prefix) + tokens.shape[1], self.slots(pk))  # the prefix's (bucketed) cache fits whole
        kc, vc = self._seed(pk, pv, batch=tokens.shape[0], slots=cache_slots(need, slots))
        logits, kc, vc = self._extend(self.params, self._in(tokens), self._in(lengths),
                                      self._in(np.int32(len(prefix))), kc, vc)
        return (*self._head(logits, k=k, want_logits=want_logits), (kc, vc))

    def prefix_cache(self, prefix: tuple[int, ...]) -> tuple[list, list]:
        """The K/V cache of a prefix prefilled alone, kept for the next call that shares it (one entry)."""
        if self._prefix is None or self._prefix[0] != prefix:
            P = len(prefix)
            ptoks = np.zeros((1, next_pow2(P, MIN_PREFILL_BUCKET)), np.int32)
            ptoks[0, :P] = prefix
            self._prefix = (prefix, self._prefill_step(ptoks, np.array([P], np.int32), ptoks.shape[1], 1, False)[-1])
        return self._prefix[1]

    def _insert_step(self, state, rows, where, src, batch, slots):
        """Rows src of a fresh prefill's cache into batch rows where (continuous batching); the smaller
        cache grows to the larger's slots first."""
        if state is None:
            state = self.new_cache(batch, self.slots(rows[0]))
        S, Sr = self.slots(state[0]), self.slots(rows[0])
        if Sr > S:
            state = self._grow(*state, slots=Sr)
        elif Sr < S:
            rows = self._grow(*rows, slots=S)
        return self._put(*state, *rows, self._in(where), self._in(src))

    def _shrink_step(self, state, keep):
        """The cache rows of the batch slots in keep (finished rows dropped)."""
        return self._gather(*state, self._in(keep))

    def _decode_step(self, ids, positions, state, k, want_logits):
        need = cache_slots(int(np.max(positions)) + 1, 1 << 30)
        if need > self.slots(state[0]):  # the cache grows by buckets as the rows advance
            state = self._grow(*state, slots=need)
        logits, kc, vc = self._decode(self.params, self._in(ids), self._in(positions), *state)
        return (*self._head(logits, k=k, want_logits=want_logits), (kc, vc))

    def new_cache(self, batch: int, slots: int) -> tuple[list, list]:
        """Empty K and V caches: per layer [batch, K, slots, hd] (a GDN layer: its zero state, model.empty_cache)."""
        kc, vc = model.empty_cache(self.config, batch, slots, jnp.float32, self.recipe.mla if self.recipe else
                                   "expanded")
        if self.mesh is None:
            return kc, vc
        def put(x):
            return jax.device_put(x, NamedSharding(self.mesh, sharding.cache_spec(self.mesh, x.shape)))
        return [put(x) for x in kc], [put(x) for x in vc]

    def slots(self, k_cache: list) -> int:
        """The slots the attention layers' caches hold."""
        return model.cache_slots_of(self.config, k_cache)
