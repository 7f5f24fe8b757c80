"""The multi-token step a speculative engine verifies drafts with, over the reference model's forward pass.

A batch state holds, per row, the K/V cache (a slot a position) and, for hybrid models, the recurrent state
(Gated DeltaNet / Kimi Delta Attention), as engines.reference.model keeps them. `feed` runs T tokens a row at
per-row start positions over that state and returns every position's argmax and top-k (the verify step: the
anchor plus T-1 drafts, attended causally within the block and to the cache). Rollback after a rejection: a
position-indexed cache needs none (the next block overwrites the rejected drafts' slots before any query can
see them: a query at p sees slots 0..p); a recurrent state does: the reference's is rebuilt by replaying the
accepted tokens from the state before the block, the megakernel's restored from its verify step's snapshot at row
`acc` (`rolled_back`).
"""

from __future__ import annotations

from functools import lru_cache, partial

import jax
import jax.numpy as jnp
import numpy as np

from engines.base import next_pow2
from engines.config import RECURRENT
from engines.reference import model
from engines.reference.engine import ReferenceEngine


@lru_cache(maxsize=8)
def _programs(c, r) -> dict:
    """The jitted feed / prefill / put for one (config, recipe): weights and states are arguments."""
    return {"feed": jax.jit(partial(_feed, c, r), static_argnames=("k", "want_logits")),
            "prefill": jax.jit(partial(_prefill, c, r), static_argnames=("slots", "k", "want_logits")),
            "put": jax.jit(_put, donate_argnums=(0, 1)),
            "taps": jax.jit(partial(_taps, c, r)),
            "empty": jax.jit(partial(model.empty_cache, c), static_argnames=("batch", "slots"))}


def _head(logits, k, want_logits):
    logp = jax.nn.log_softmax(logits, axis=-1)
    top_v, top_i = jax.lax.top_k(logp, k)
    return jnp.argmax(logits, axis=-1).astype(jnp.int32), top_i, top_v, (logits if want_logits else None)


def _feed(c, r, p, tokens, positions, lengths, kc, vc, k, want_logits):
    """tokens, positions [B, T]; lengths [B]: the real tokens a row (a recurrent state stops there).
    Returns (argmax [B, T], top ids, top logprobs [B, T, k], logits [B, T, V] or None, kc, vc)."""
    logits, kc, vc, _ = model.forward(p, c, tokens, positions, kc, vc, recipe=r, lengths=lengths)
    return (*_head(logits, k, want_logits), kc, vc)


def _taps(c, r, p, tokens, positions, kc, vc):
    """The residual stream after every layer at each row's first block position [B, L, D] (a verify step's anchor)."""
    _, _, _, (taps, _) = model.forward(p, c, tokens, positions, kc, vc, want_taps=True, recipe=r)
    return jnp.transpose(taps[:, :, 0], (1, 0, 2))


def _prefill(c, r, p, tokens, length, slots, k, want_logits):
    """One prompt [1, Tb] (length real tokens) into a fresh state of `slots` slots: the last position's head."""
    kc, vc = model.empty_cache(c, 1, slots)
    T = tokens.shape[1]
    positions = jnp.arange(T, dtype=jnp.int32)[None, :]
    logits, kc, vc, _ = model.forward(p, c, tokens, positions, kc, vc, logit_index=length - 1, fresh=True,
                                      recipe=r, lengths=length)
    return (*_head(logits, k, want_logits), kc, vc)


def _put(kc, vc, rk, rv, row):
    """Row 0 of a one-row state into batch row `row` (continuous batching's refill)."""
    return ([x.at[row].set(y[0]) for x, y in zip(kc, rk)], [x.at[row].set(y[0]) for x, y in zip(vc, rv)])


def _padded(prompt) -> np.ndarray:
    """One prompt as [1, Tb] int32, right-padded to a power of two of at least 16 (the prefill buckets)."""
    tokens = np.zeros((1, next_pow2(len(prompt), 16)), np.int32)
    tokens[0, :len(prompt)] = prompt
    return tokens


class Runner:
    """One model's batch state and its steps (the target's or a draft model's). Host arrays in, host arrays out.
    A rollback replays the kept tokens from the state before the block."""

    def __init__(self, ref: ReferenceEngine):
        self.ref, self.config = ref, ref.config
        self._p = _programs(ref.config, ref.recipe)
        self.recurrent = any(ref.config.kind(i) in RECURRENT for i in range(ref.config.n_layers))

    def empty(self, batch: int, slots: int):
        return self._p["empty"](batch=batch, slots=slots)

    def prefill(self, prompt, slots: int, k: int, want_logits: bool):
        """(argmax, top ids [k], top logprobs [k], logits or None, one-row state) after the prompt."""
        tokens = _padded(prompt)
        nxt, ti, tv, lg, kc, vc = self._p["prefill"](self.ref.params, jnp.asarray(tokens),
                                                     jnp.asarray([len(prompt)], np.int32), slots=slots, k=k,
                                                     want_logits=want_logits)
        return (int(nxt[0]), np.asarray(ti[0]), np.asarray(tv[0]), None if lg is None else np.asarray(lg[0]),
                (kc, vc))

    def put(self, state, row_state, row: int):
        return self._p["put"](*state, *row_state, jnp.int32(row))

    def anchor_taps(self, state, tokens: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """[B, L, D]: the taps of a verify step's first position (tokens, positions [B, T])."""
        return np.asarray(self._p["taps"](self.ref.params, jnp.asarray(tokens, jnp.int32),
                                          jnp.asarray(positions, jnp.int32), *state))

    def rolled_back(self, before, after, tokens, positions, lengths: np.ndarray):
        """The state after each row's first lengths[b] block tokens, replayed from `before`."""
        return self.feed(before, tokens, positions, lengths, 1, False)[-1]

    def feed(self, state, tokens: np.ndarray, positions: np.ndarray, lengths: np.ndarray, k: int,
             want_logits: bool):
        """(argmax [B, T], top ids, top logprobs [B, T, k], logits or None as host arrays, the new state)."""
        nxt, ti, tv, lg, kc, vc = self._p["feed"](self.ref.params, jnp.asarray(tokens, jnp.int32),
                                                  jnp.asarray(positions, jnp.int32), jnp.asarray(lengths, jnp.int32),
                                                  *state, k=k, want_logits=want_logits)
        return np.asarray(nxt), np.asarray(ti), np.asarray(tv), None if lg is None else np.asarray(lg), (kc, vc)


class KernelRunner:
    """The megakernel engine as a target: a block of T tokens a row is verified by ONE call of its decode kernel
    (engines.megakernel.verify): every block token a query row, attending the cache and its block causally, and a
    hybrid model's recurrent state returned after every block token. A rollback restores a row's state from the
    snapshot after its kept tokens (no replay); rows past their `lengths` take the snapshot at their last real one."""

    def __init__(self, eng):
        self.eng, self.config = eng, eng.config
        self.recurrent = any(eng.config.kind(i) in RECURRENT for i in range(eng.config.n_layers))
        self._shape = (1, 128)
        self._snapshots: tuple = ()  # the last verify step's

    def empty(self, batch: int, slots: int):
        self._shape = (batch, slots)
        return None  # made by the first put (the engine's own refill step builds a zero state)

    def prefill(self, prompt, slots: int, k: int, want_logits: bool):
        nxt, ti, tv, lg, state = self.eng.steps().prefill(_padded(prompt), np.array([len(prompt)], np.int32), slots, k,
                                                          want_logits)
        return (int(np.asarray(nxt)[0]), np.asarray(ti)[0], np.asarray(tv)[0],
                None if lg is None else np.asarray(lg)[0], state)

    def put(self, state, row_state, row: int):
        B, S = self._shape
        return self.eng.steps().insert(state, row_state, np.array([row], np.int32), np.array([0], np.int32), B, S)

    def feed(self, state, tokens: np.ndarray, positions: np.ndarray, lengths: np.ndarray, k: int,
             want_logits: bool):
        from engines.megakernel import verify

        v = verify.step(self.eng, tokens, positions, state, k, want_logits)
        self._snapshots = v.snapshots
        T = tokens.shape[1]
        state = verify.restored(v.state, v.snapshots, np.minimum(lengths, T)) if np.any(lengths < T) else v.state
        return v.argmax, v.top_ids, v.top_logprobs, v.logits, state

    def rolled_back(self, before, after, tokens, positions, lengths: np.ndarray):
        """The state after each row's first lengths[b] block tokens: the last step's snapshots (`before` is unused;
        the step donated it)."""
        from engines.megakernel import verify

        return verify.restored(after, self._snapshots, lengths)

    def anchor_taps(self, state, tokens: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """[B, L, D]: the taps of a verify step's first position, from the kernel's own verify call."""
        from engines.megakernel import verify

        return verify.step(self.eng, tokens, positions, state, 1, False, want_taps=True).taps[:, 0]
