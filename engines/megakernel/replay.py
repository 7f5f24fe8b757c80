"""What the megakernel reports about its own steps beyond logits: the residual stream after each layer (step_taps,
for bisection) and each MoE layer's expert choice along forced_topk's path (forced_routing, for a routing replay:
the judge re-runs the reference with the engine's experts where a near-tie let rounding choose)."""

from __future__ import annotations

from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

from engines.base import Forced
from engines.errors import ModelError
from engines.loop import Steps, attention_window, batches, forced_batch, forced_split, pad
from engines.megakernel.prefill import prefill_hidden


def prefill_routes(programs, w, tokens, lengths, slots):
    """The prefill (programs._prefill_impl's math) with each MoE layer's gates: last hidden [B, D], the state, and
    the gates [M, B, T, E] (nonzero: the experts chosen at each token)."""
    routes: list = []
    x, state, _ = prefill_hidden(programs.config, w["hbm"], w["embed"], w["rope"], tokens, slots,
                                 numerics=programs.numerics, lengths=lengths, routes=routes)
    last = jnp.take_along_axis(x, (lengths - 1)[:, None, None], axis=1)[:, 0]
    return last, state, jnp.stack([g.reshape(*tokens.shape, -1) for g in routes])


def chosen(gates: np.ndarray, k: int) -> np.ndarray:
    """[..., E] gates -> [..., k] the chosen experts' ids, ascending (the nonzero gates; a router's weight of a chosen
    expert is a sigmoid or softmax value, never exactly zero)."""
    idx = np.argsort(np.asarray(gates) == 0, axis=-1, kind="stable")[..., :k]
    return np.sort(idx, axis=-1).astype(np.int32)


def forced_routing(eng, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]], k: int,
                   want_logits: bool) -> list[Forced]:
    """forced_topk's path (the prompt but its last token prefilled, the rest fed by kernel steps) with taps on, so
    each step's MoE gates come back with its logits: the routing is that of the very run the logits are from.
    Rows are batched as forced_topk batches them (forced_all's calls), each prompt prefilled on its own row."""
    c = eng.config
    if not c.n_moe_layers:
        raise ModelError(f"forced_routing: {c.name} has no MoE layer, so no expert choice to report")
    eng._check([list(p) + list(x) for p, x in zip(prompts, continuations)], 1)
    pre, cont, drop = forced_split(prompts, continuations)
    out: list[Forced | None] = [None] * len(prompts)
    for idx in batches([len(pre[i]) for i in range(len(prompts))], eng.max_batch):
        logits, gates = _one_call(eng, [pre[i] for i in idx], [cont[i] for i in idx])
        for lg, g, i in zip(logits, gates, idx):
            rec = Forced.from_logits(lg[drop[i]:], continuations[i], k, want_logits)
            out[i] = Forced(rec.token_logprobs, rec.top_ids, rec.top_logprobs, rec.logits, chosen(g, c.top_k))
    return out


def _one_call(eng, pre: list, cont: list) -> tuple[list, list]:
    """One forced_batch call (engines.loop) with taps on: per row its logits [N, V] and gates [M, P + N - 1, E]."""
    got: dict = {"steps": []}

    def prefill(tokens, lengths, slots, k, want_logits):
        x, state, g = eng._prefill_routes(eng.w, jnp.asarray(tokens), jnp.asarray(lengths), slots=slots)
        got["pre"] = np.asarray(g)  # [M, B, Tb, E]
        return (*eng._head(eng.w, x, k=k, want_logits=want_logits, decode=False), state)

    def decode(ids, positions, state, k, want_logits):
        window = attention_window(positions, state[0].shape[3])
        x, state, (_, g) = eng._decode(eng.w, jnp.asarray(ids), jnp.asarray(positions), state, want_taps=True,
                                       window=window)
        got["steps"].append(np.asarray(g))  # [M, B, E]
        return (*eng._head(eng.w, x, k=k, want_logits=want_logits, decode=True), state)

    logits = forced_batch(Steps(prefill, decode), pre, cont)
    M, _, _, E = got["pre"].shape
    steps = np.stack(got["steps"], axis=2) if got["steps"] else np.zeros((M, len(pre), 0, E))
    return logits, [np.concatenate([got["pre"][:, r, :len(p)], steps[:, r, :len(x) - 1]], axis=1)
                    for r, (p, x) in enumerate(zip(pre, cont))]


def step_taps(eng, prompts: Sequence[Sequence[int]], next_ids: Sequence[int], decoded: int = 0) -> np.ndarray:
    """MegakernelEngine.step_taps: [rows, L, D], the residual stream after each layer at one kernel step on next_ids
    after prompts, whose last `decoded` tokens are fed by kernel steps first."""
    eng._check([list(p) + [t] for p, t in zip(prompts, next_ids)], 1)
    if any(len(p) <= decoded for p in prompts):
        raise ModelError(f"step_taps: decoded={decoded} needs every prompt longer than that")
    n = len(prompts)
    tokens, lengths, S = pad([list(p[:len(p) - decoded]) for p in prompts], decoded + 1)
    _, state = eng._prefill(eng.w, jnp.asarray(tokens), jnp.asarray(lengths), slots=S)
    for j in range(decoded + 1):
        ids = np.zeros(len(lengths), np.int32)
        ids[:n] = [p[len(p) - decoded + j] for p in prompts] if j < decoded else next_ids
        pos = lengths + j
        _, state, taps = eng._decode(eng.w, jnp.asarray(ids), jnp.asarray(pos), state,
                                     want_taps=j == decoded, window=attention_window(pos, S))
    return np.asarray(taps[0]).transpose(1, 0, 2)[:n]
