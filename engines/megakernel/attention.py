"""The decode kernel's attention: every row and KV head at once over the cache, streamed from HBM in tiles under
an online softmax (engines.megakernel.kernel starts and waits the tiles' DMAs through kv_tile)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from engines.megakernel import ops
from engines.megakernel.spec import KernelSpec, cache_dims

F32 = jnp.float32


# Cache positions a piece of the last attended tile moves: a step reads the KV its rows attend rounded up to PIECE,
# not to the tile (at a 200-token context a 128-position tile read 256 positions a row, mini-llama's step 1.20x the
# ideal's bytes at batch 8; 16 is a bfloat16 vreg's rows, the smallest whole tile of either KV dtype).
PIECE = 16


class TileCopy:
    """Tile t's K and V copies at the size its rows need: the one of TS / PIECE sizes (PIECE, 2 PIECE, .., TS) that
    covers the positions below n_pos, picked by one lax.switch at the start and the same one at the wait (one
    branch a tile, not a condition a piece: the generic interpreter pays for every condition it meets)."""

    def __init__(self, spec: KernelSpec, pairs, sems, a, t: int, n_pos):
        TS, j = spec.tile, t % spec.kv_buffers
        piece = min(PIECE, TS)
        self.pick = jnp.clip(jax.lax.div(n_pos - t * TS + piece - 1, piece), 1, TS // piece) - 1
        self.sizes = [[pltpu.make_async_copy(src.at[a, :, :, pl.ds(t * TS, n), :], dst[j].at[:, :, pl.ds(0, n), :],
                                             sems.at[j, i]) for i, (src, dst) in enumerate(pairs)]
                      for n in range(piece, TS + 1, piece)]

    def _each(self, go):
        def branch(cps):
            def run():
                for cp in cps:
                    go(cp)
            return run

        branches = [branch(cps) for cps in self.sizes]
        if len(branches) == 1:
            branches[0]()
        else:
            jax.lax.switch(self.pick, branches)

    def start(self):
        self._each(lambda cp: cp.start())

    def wait(self):
        self._each(lambda cp: cp.wait())


def tile_copies(spec: KernelSpec, pairs, sems, a, t: int, n_pos) -> list[TileCopy]:
    """Tile t (cache positions t*TS..) of cache layer a, for each (cache in HBM, its KV buffers) of pairs, into buffer
    t % kv_buffers, up to n_pos (the positions any row attends) rounded up to PIECE. What the copy leaves unread is
    masked, as every unattended slot is."""
    return [TileCopy(spec, pairs, sems, a, t, n_pos)]


def write_back(spec: KernelSpec, pairs, sems, pos_s) -> list:
    """Every attention layer's new K/V slots (pairs: (staged [Lkv, R, ..], cache in HBM)) to HBM after the last layer,
    each query row's at its position in its cache row, the copies started (the caller waits). No layer reads another
    layer's cache, so the writes can wait, and the layer loop only ever reads the cache (writes inside it made the
    generic interpreter copy the whole cache per write)."""
    out, T = [], spec.block
    for r in range(spec.rows):
        b = r // T
        for j, (src, dst) in enumerate(pairs):
            slot = pos_s[r] - (1 if spec.knobs.odd_rows_write_early and b % 2 else 0)  # the fault: odd rows early
            cp = pltpu.make_async_copy(src.at[:, r], dst.at[:, b, :, pl.ds(slot, 1), :], sems.at[j, r])
            cp.start()
            out.append(cp)
    return out


def window(spec: KernelSpec) -> tuple[bool, int]:
    """(whether any layer slides, a sliding layer's reach: its query at p sees p - reach + 1 .. p)."""
    c = spec.config
    return "sliding" in c.layer_kinds, c.sliding_window + spec.knobs.window_offset


def n_tiles(spec: KernelSpec) -> int:
    """The tiles of the window the step reads (the skip_last_tile fault drops the last of two or more)."""
    n = (spec.window or spec.slots) // spec.tile
    return n - (1 if spec.knobs.skip_last_tile and n > 1 else 0)


def _scale(spec: KernelSpec, sliding, mla: bool):
    """The scores' scale: an MLA key's true width (n + r)^-1/2 (the fault: its padded width's), or 1/sqrt(hd) or
    Gemma's query_pre_attn_scalar**-0.5, times a scaled RoPE's factor (YaRN)."""
    c, kn, hd = spec.config, spec.knobs, cache_dims(spec.config, spec.mla)[1]
    if mla:  # either form: the expanded key's width, n + r
        width = c.mla_nope_dim + c.mla_rope_dim
        return (pl.next_power_of_2(width) if kn.mla_scale_padded else width) ** -0.5
    base = ((c.query_scale or hd) + kn.scale_dim_offset) ** -0.5
    scales = [base * ops.rope_freqs(c, kind)[1] for kind in ("full", "sliding")]
    return jnp.where(sliding, scales[1], scales[0]) if scales[0] != scales[1] else scales[0]


def _start(spec: KernelSpec, sinks):
    """An online softmax's start (max, sum, accumulator) over the B*K groups of G heads: empty, or gpt-oss's sinks
    (a learned logit per head) already in the denominator."""
    c, kn, B = spec.config, spec.knobs, spec.batch
    K, _, dv = cache_dims(c, spec.mla)
    G = c.n_heads // K
    init = (jnp.full((B * K, G, 1), -jnp.inf, F32), jnp.zeros((B * K, G, 1), F32), jnp.zeros((B * K, G, dv), F32))
    if sinks is None or kn.sink_dropped:  # sink_dropped, the fault: left out of the denominator
        return init
    sk = sinks.reshape(1, G, K).transpose(0, 2, 1) if kn.gqa_transposed else sinks.reshape(1, K, G)  # head kh*G + g
    return ops.reshape(jnp.broadcast_to(sk, (B, K, G)), B * K, G, 1), jnp.ones((B * K, G, 1), F32), init[2]


def attend(spec: KernelSpec, q, k, v, blk, sliding, first, live, kv_tile, kbufs, vbufs, sinks, mla: bool = False):
    """q [R, H*dk], the new tokens' k [R, K*dk], v [R, K*dv] (as the cache holds them): R = B*T query rows (spec.rows),
    row b*T + t token t of cache row b's block; blk [B, T] the blocks' positions; sliding (traced) the layer's kind;
    tiles first .. live-1 are read (kv_tile(t): tile t's two copies into buffer t % kv_buffers); sinks [1, H] or
    None. mla: an MLA layer's (spec.cache_dims: expanded, K = H heads; absorbed, one the H heads share). Returns the
    heads' outputs [R, H*dv] float32.

    Each block token has its own online softmax over n = B*K groups of G query heads (head kh*G + g of cache row b
    -> group b*K + kh, row g), so a cache tile is read once for all T of them and never copied per row. A token
    attends the cache below its block's first position, then its block's new K/V up to its own position, last (the
    cache holds none of the block's slots yet), so no VMEM copy of the cache is ever written. The tile loop is
    static: a traced loop made the generic interpreter carry (and copy) every scratch buffer per iteration, 5x
    slower at batch 8."""
    c, kn = spec.config, spec.knobs
    B, H, TS, T = spec.batch, c.n_heads, spec.tile, spec.block
    K, hd, dv = cache_dims(c, spec.mla)
    G, nt = H // K, n_tiles(spec)
    windowed, win = window(spec)
    gqa_t = kn.gqa_transposed  # query head h reads kv head h % K instead of h // G
    scale = _scale(spec, sliding, mla)
    token = (lambda a, t: a) if T == 1 else (lambda a, t: ops.rows_of(a, t, T))  # noqa: E731 (token t's [B, ..])
    qg = [ops.reshape(ops.reshape(qt, B, G, K, hd).transpose(0, 2, 1, 3) if gqa_t else qt, B * K, G, hd) * scale
          for qt in (token(q, t) for t in range(T))]
    heads = lambda a: jnp.repeat(a, K, axis=0)[:, :, None]  # noqa: E731 ([B, 1] -> [n, 1, 1])
    start, at = heads(blk[:, 0:1]), [heads(blk[:, t:t + 1]) for t in range(T)]  # the block's first, token t's

    def written(col):
        """The cache positions `col` (broadcasting against [n, 1, 1]) the block's tokens may read."""
        ok = (col <= start) if kn.mask_own_slot else (col < start)
        return (ok & (col > 0)) if kn.mask_first_slot else ok

    def seen(col, t):
        """Those block token t attends (a sliding layer's window ends at its own position)."""
        return (written(col) & ((col > at[t] - win) | jnp.logical_not(sliding))) if windowed else written(col)

    def capped(sc, ok):
        """Soft-capped scores (Gemma 2), -inf where not attended; the cap goes before the mask."""
        if kn.softcap_after_mask:  # -inf capped to -cap: masked slots join the denominator
            return ops.softcap(jnp.where(ok, sc, -jnp.inf), c.attn_softcap)
        return jnp.where(ok, ops.softcap(sc, c.attn_softcap), -jnp.inf)

    states = [_start(spec, sinks)] * T  # each block token's online softmax
    for t in range(nt):  # a tile no row attends is neither copied nor read (bitwise the same: a fully masked
        # tile adds exactly nothing to the online softmax)
        def tile_step(states, t=t):
            for cp in kv_tile(t):
                cp.wait()
            if t + 1 < nt:
                @pl.when(t + 1 < live)
                def _():
                    for cp in kv_tile(t + 1):
                        cp.start()

            j = t % spec.kv_buffers
            kt = kbufs[j][...].reshape(B * K, TS, hd).astype(F32)
            col = t * TS + jax.lax.broadcasted_iota(jnp.int32, (B * K, 1, TS), 2)
            # V is masked as well as the scores: an unwritten slot may hold anything (NaN included), and a zero
            # probability times NaN is NaN (a written slot outside a window is finite, and its probability 0)
            vt = jnp.where(written(t * TS + jax.lax.broadcasted_iota(jnp.int32, (B * K, TS, 1), 1)),
                           vbufs[j][...].reshape(B * K, TS, dv).astype(F32), 0.0)
            return [ops.online_softmax_step(st, capped(jnp.einsum("nqd,nkd->nqk", qg[u], kt, preferred_element_type=F32,
                                                                  precision=ops.precision(F32)), seen(col, u)), vt)
                    for u, st in enumerate(states)]  # scores [n, G, TS]

        states = jax.lax.cond((t >= first) & (t < live), tile_step, lambda s: s, states)
    new = [(ops.reshape(token(k, t), B * K, 1, hd), ops.reshape(token(v, t), B * K, 1, dv)) for t in range(T)]
    ahead = 1 if kn.block_mask_ahead else 0  # the fault: a token also sees the next block token
    outs = []
    for t, st in enumerate(states):
        for u in range(0 if kn.skip_new_kv else min(T, t + 1 + ahead)):  # skip_new_kv (the fault): none attended
            ok = at[u] <= at[t] + ahead  # block token u's K/V, causal by position (a block's positions ascend)
            ok = (ok & ((at[u] > at[t] - win) | jnp.logical_not(sliding))) if windowed else ok
            sc = jnp.einsum("nqd,nkd->nqk", qg[t], new[u][0], preferred_element_type=F32,
                            precision=ops.precision(F32))  # [n, G, 1]
            st = ops.online_softmax_step(st, capped(sc, ok), jnp.where(ok, new[u][1], 0.0))
        _, lsum, acc = st
        out = jnp.where(lsum > 0, acc / jnp.maximum(lsum, 1e-30), 0.0)  # [n, G, dv]
        outs.append(ops.reshape(out.reshape(B, K, G, dv).transpose(0, 2, 1, 3) if gqa_t else out, B, H * dv))
    return outs[0] if T == 1 else ops.interleave(outs)
