"""The megakernel engine's jitted programs, one set per static spec (the model, the fault's kernel knobs, the
interpret mode, the cache and recipe settings), shared by every engine built with that spec."""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache, partial
from pathlib import Path

import jax
import jax.numpy as jnp

from engines import lowered
from engines.loop import MIN_WINDOW
from engines.megakernel import ops, replay
from engines.megakernel.budget import budget
from engines.megakernel.faults import Knobs
from engines.megakernel.kernel import KernelSpec, decode_layers
from engines.megakernel.prefill import prefill_hidden
from engines.megakernel.spec import mode_dtype
from engines.megakernel.tpu import tpu_interpret_params
from engines.megakernel.verify import kernel_block
from engines.recipe import Recipe

ATTN_TILE = 128  # cache positions per online-softmax step (or all slots when fewer)

# Static specs whose compiled programs are kept. Each costs memory maps for its code (mini-llama's generate: about
# 630 a spec, the same with its steps read back from disk, engines.lowered); past vm.max_map_count (65,530) LLVM aborts
# (the float32 detection recheck with 16 kept). 6 keeps a run's faithful, faulty, bf16 and float32-build specs.
MAX_SPECS = 6


@lru_cache(maxsize=MAX_SPECS)
def _programs(c, kn, fault_layer, n_buffers, interpret, batch_invariant, chip, experts, numerics) -> _Programs:
    """One _Programs per static spec, shared by every engine built with it (weights are arguments)."""
    return _Programs(c, kn, fault_layer, n_buffers, interpret, batch_invariant, chip, experts, numerics)


class _Programs:
    """The engine's jitted steps and what they read: the static spec only, never the weights (arguments), so every
    engine with the same spec shares them and a new engine does not trace the kernel again."""

    def __init__(self, c, kn: Knobs, fault_layer, n_buffers, interpret, batch_invariant, chip, experts,
                 numerics: Recipe):
        self.config, self.knobs, self.fault_layer, self.n_buffers, self.chip = c, kn, fault_layer, n_buffers, chip
        self.experts = experts
        self.numerics = numerics  # where the steps round (the declared bf16 recipe; float32: nothing)
        self.interpret = {"generic": True, "tpu": tpu_interpret_params(), "mosaic": False}[interpret]
        self.batch_invariant = batch_invariant
        # the Pallas steps in the generic interpreter: their lowered programs kept on disk (engines.lowered)
        kernel_jit = partial(lowered.jit, package_dir=Path(__file__).parent, keep=interpret == "generic",
                             spec={"programs": repr((c, kn, fault_layer, n_buffers, batch_invariant, chip, experts,
                                                     numerics))},
                             static_argnames=("want_taps", "window"),
                             donate_argnums=(3,))
        self.final_eps = c.rms_eps if kn.final_norm_eps is None else kn.final_norm_eps  # the decode step's
        self.jitted = {
            "_prefill": jax.jit(self._prefill_impl, static_argnames=("slots",)),
            "_extend": jax.jit(self._extend_impl, static_argnames=("slots",)),
            "_prefix_kv": jax.jit(lambda w, tokens, lengths: prefill_hidden(
                self.config, w["hbm"], w["embed"], w["rope"], tokens, tokens.shape[1], numerics=self.numerics,
                lengths=lengths)[1]),
            "_score": jax.jit(self._score_impl, static_argnames=("want_taps",)),
            "_prefill_routes": jax.jit(partial(replay.prefill_routes, self), static_argnames=("slots",)),
            # the state: caches [La, B, K, S, hd] (and a GDN model's hist, S [Lg, B, ...]), rows on axis 1
            "_gather": jax.jit(lambda state, keep: tuple(a[:, keep] for a in state)),
            "_put": jax.jit(lambda state, rows, where, src: tuple(a.at[:, where].set(r[:, src])
                                                                  for a, r in zip(state, rows)),
                            donate_argnums=(0,)),
            # The decode step is two programs: the kernel (keyed by its shape: rows, slots, window, taps) and the head
            # (final norm, logits, top-k; keyed by k and want_logits). One program for both traced and lowered the
            # kernel again for every (k, want_logits) a caller used, about 1.6 s each for mini-llama.
            "_decode": kernel_jit(self._decode_impl, "_decode"),
            "_head": jax.jit(self._head_impl, static_argnames=("k", "want_logits", "decode")),
            "_verify": kernel_jit(partial(kernel_block, self), "_verify"),
        }

    # ---- jitted pieces -------------------------------------------------------------------------
    def _logits(self, w, x, eps=None):
        c = self.config
        logits = ops.mm(ops.rmsnorm(x, w["final_norm"], c.rms_eps if eps is None else eps), w["head_t"])
        return ops.softcap(logits * c.logit_scale if c.logit_scale != 1.0 else logits, c.final_softcap)  # Muse's

    def _pick(self, logits, k, want_logits):
        z = logits - jnp.max(logits, axis=-1, keepdims=True)
        logp = z - jnp.log(jnp.sum(jnp.exp(z), axis=-1, keepdims=True))
        top_v, top_i = jax.lax.top_k(logp, k)
        if self.knobs.topk_renormalized:  # log-softmax over the k ids instead of the vocabulary
            top_v = top_v - jax.nn.logsumexp(top_v, axis=-1, keepdims=True)
        if self.knobs.topk_ranks_swapped and k >= 3:  # ranks 2 and 3 carry each other's ids
            top_i = top_i.at[:, 1:3].set(top_i[:, 2:0:-1])
        return jnp.argmax(logits, axis=-1).astype(jnp.int32), top_i, top_v, (logits if want_logits else None)

    def _prefill_impl(self, w, tokens, lengths, slots):
        """Each row's last hidden state [B, D] (its logits come from _head) and the state (caches, GDN state)."""
        x, state, _ = prefill_hidden(self.config, w["hbm"], w["embed"], w["rope"], tokens, slots,
                                     numerics=self.numerics, lengths=lengths)
        return jnp.take_along_axis(x, (lengths - 1)[:, None, None], axis=1)[:, 0], state

    def _extend_impl(self, w, prefix, tokens, lengths, slots):
        x, state, _ = prefill_hidden(self.config, w["hbm"], w["embed"], w["rope"], tokens, slots,
                                     prefix=prefix, numerics=self.numerics, lengths=lengths)
        return jnp.take_along_axis(x, (lengths - 1)[:, None, None], axis=1)[:, 0], state

    def _score_impl(self, w, tokens, want_taps):
        x, _, taps = prefill_hidden(self.config, w["hbm"], w["embed"], w["rope"], tokens,
                                    tokens.shape[1], want_taps, numerics=self.numerics)
        return self._logits(w, x), taps

    def _spec(self, batch: int, slots: int, want_taps: bool, window: int | None, dtype: str,
              block: int = 1) -> KernelSpec:
        window = window or slots
        # invariant: one tiling for every window (generate's windows are all multiples of MIN_WINDOW)
        tile = min(MIN_WINDOW if self.batch_invariant else ATTN_TILE, window)
        spec = KernelSpec(self.config, batch, slots, tile, window, self.knobs.only("kernel"),
                          self.fault_layer, self.n_buffers, want_taps, self.interpret, experts=self.experts,
                          block=block, numerics=self.numerics)
        return replace(spec, vmem_limit=budget(spec, dtype, self.chip).limit)

    def _decode_impl(self, w, ids, pos, state, want_taps=False, window=None):
        """The kernel step: hidden states after the last layer [B, D], the updated state, taps."""
        spec = self._spec(ids.shape[0], state[0].shape[3], want_taps, window, str(mode_dtype(w["hbm"])))
        x = ops.embedded(self.config, w["embed"], ids)
        x, kc, vc, taps, *rec = decode_layers(spec, w["hbm"], x, pos, state[0], state[1], w["rope_decode"],
                                              tuple(state[2:]))
        routed = want_taps and self.config.n_moe_layers  # with taps: (taps, each MoE layer's gates or None)
        return x, (kc, vc, *(rec[:-1] if routed else rec)), ((taps, rec[-1] if routed else None) if want_taps else taps)

    def _head_impl(self, w, x, k, want_logits, decode):
        """Final norm, logits and top-k of hidden states [B, D]. Only the kernel's (decode) head takes a
        final-norm fault: the prefill is XLA and never faulted."""
        return self._pick(self._logits(w, x, self.final_eps if decode else None), k, want_logits)
