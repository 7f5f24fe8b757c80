"""The megakernel's multi-token verify step: a speculative engine's anchor and T-1 drafts a row through ONE call of
the decode kernel (engines.megakernel.kernel with spec.block = T). Every block token is a query row at its own
position; a row attends the cache below its block's first position and the block's new K/V causally; the new K/V
go to their slots after the last layer; a recurrent layer steps the block's tokens in order and returns the state
after each (the snapshot a rollback to `acc` accepted drafts restores, with no replay)."""

from __future__ import annotations

from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np

from engines.loop import attention_window
from engines.megakernel import ops
from engines.megakernel.faults import Knobs
from engines.megakernel.kernel import decode_layers
from engines.megakernel.spec import mode_dtype

F32 = jnp.float32

# Faults of the verify step alone (a decode step has no block to mask), for the speculative engine's megakernel
# target: {name: (knobs, what it does, the real bug)}
VERIFY_FAULTS = {"block_mask_ahead": (Knobs(block_mask_ahead=True), "the verify step's causal mask within the block "
                                      "admits the next block token (off by one)", "a block-causal mask built with "
                                      "<= where < belongs (or from the wrong row's position)")}


def kernel_block(programs, w, ids, pos, state, want_taps: bool = False, window: int | None = None):
    """The kernel over ids, pos [B, T] (jitted by the engine's programs): hidden states [B*T, D] (row b*T + t), the
    state after the block, the snapshots ([Lg, T, B, ...] a state array; () without recurrent layers), taps."""
    B, T = ids.shape
    spec = programs._spec(B, state[0].shape[3], want_taps, window, str(mode_dtype(w["hbm"])), block=T)
    x = ops.embedded(programs.config, w["embed"], ids.reshape(-1))
    x, kc, vc, taps, *rest = decode_layers(spec, w["hbm"], x, pos.reshape(-1), state[0], state[1], w["rope_decode"],
                                           tuple(state[2:]))
    n = len(state) - 2
    if want_taps and programs.config.n_moe_layers:  # the MoE gates come last with taps (unused here)
        rest = rest[:-1]
    return x, (kc, vc, *rest[:n]), tuple(rest[n:]), taps


@dataclass
class Verified:
    """A verify step's outputs, host arrays [B, T, ...] (logits only when asked for; taps [B, T, L, D] when asked)."""

    argmax: np.ndarray
    top_ids: np.ndarray
    top_logprobs: np.ndarray
    logits: np.ndarray | None
    state: tuple  # after every block token (device arrays, the engine's state layout)
    snapshots: tuple  # each recurrent state array after each block token, [Lg, T, B, ...]
    taps: np.ndarray | None = None


def step(eng, tokens: np.ndarray, positions: np.ndarray, state, k: int, want_logits: bool,
         want_taps: bool = False) -> Verified:
    """One verify step of eng (a MegakernelEngine) over tokens, positions [B, T] from state (donated)."""
    B, T = tokens.shape
    window = attention_window(positions, state[0].shape[3])
    x, state, snaps, taps = eng._verify(eng.w, jnp.asarray(tokens, jnp.int32), jnp.asarray(positions, jnp.int32),
                                        state, want_taps=want_taps, window=window)
    nxt, ti, tv, lg = eng._head(eng.w, x, k=k, want_logits=want_logits, decode=True)
    shaped = [None if a is None else np.asarray(a).reshape(B, T, *a.shape[1:]) for a in (nxt, ti, tv, lg)]
    taps = np.asarray(taps).transpose(1, 0, 2).reshape(B, T, *taps.shape[::2]) if want_taps else None
    return Verified(*shaped, state=state, snapshots=snaps, taps=taps)


def restored(state: tuple, snapshots: tuple, kept: np.ndarray) -> tuple:
    """The state with each row's recurrent arrays as they were after its first kept[b] block tokens (1..T): the
    rollback after a rejection (the K/V cache is position-indexed and needs none)."""
    if not snapshots:
        return state
    idx, rows = jnp.asarray(np.asarray(kept) - 1, jnp.int32), jnp.arange(len(kept))
    n = len(state) - len(snapshots)
    return (*state[:n], *[s[:, idx, rows] for s in snapshots])
