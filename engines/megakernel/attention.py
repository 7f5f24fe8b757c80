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


def attend(spec: KernelSpec, q, k, v, pos_v, blk, sliding, first, live, kv_tile, kbufs, vbufs, sinks,
           mla: bool = False):
    """q [R, H*dk], the new tokens' k [R, K*dk], v [R, K*dv] (as the cache holds them), pos_v [R, 1], blk [R, T] the
    positions of the row's block (R = B*T rows: spec.rows; the cache tiles hold B rows, each read by its T); sliding
    (traced) the layer's kind; tiles first .. live-1 are read (kv_tile(t): tile t's two copies into buffer
    t % kv_buffers); sinks [1, H] or None. mla: an MLA layer's (K = H heads, keys n + r wide, values v wide:
    spec.cache_dims). Returns the heads' outputs [R, H*dv] float32.

    n = R*K groups of G query heads (head kh*G + g of row r -> group r*K + kh, row g). A row attends the cache below
    its block's first position, then the block's new K/V up to its own position, last (the cache holds none of the
    block's slots yet), so no VMEM copy of the cache is ever written. The
    tile loop is static: a traced loop made the generic interpreter carry (and copy) every scratch buffer per
    iteration, 5x slower at batch 8."""
    c, kn = spec.config, spec.knobs
    R, H, TS, T = spec.rows, c.n_heads, spec.tile, spec.block
    K, hd, dv = cache_dims(c)
    G, nt = H // K, n_tiles(spec)
    windowed, win = window(spec)
    gqa_t = kn.gqa_transposed  # query head h reads kv head h % K instead of h // G
    if mla:  # the key's true width (n + r)^-1/2; the fault: a kernel's padded width's
        scale = (pl.next_power_of_2(hd) if kn.mla_scale_padded else hd) ** -0.5
    else:  # 1/sqrt(hd) or Gemma's query_pre_attn_scalar**-0.5, times a scaled RoPE's factor (YaRN)
        base = ((c.query_scale or hd) + kn.scale_dim_offset) ** -0.5
        scales = [base * ops.rope_freqs(c, kind)[1] for kind in ("full", "sliding")]
        scale = jnp.where(sliding, scales[1], scales[0]) if scales[0] != scales[1] else scales[0]
    qg = ops.reshape(ops.reshape(q, R, G, K, hd).transpose(0, 2, 1, 3) if gqa_t else q, R * K, G, hd) * scale
    heads = lambda a: jnp.repeat(a, K, axis=0)[:, :, None]  # noqa: E731 (a row's [R, 1] for each of its K groups)

    def block_kv(a, t: int, d: int):
        """Block token t's K or V (a [R, K*d]) for each row of its block: [n, 1, d] (the row's own at T = 1)."""
        if T == 1:
            return ops.reshape(a, R * K, 1, d)
        return ops.spread(ops.reshape(ops.rows_of(a, t, T), R // T, K, 1, d), T).reshape(R * K, 1, d)
    row_pos, row_start = heads(pos_v), heads(blk[:, 0:1])  # [n, 1, 1]: the row's position, its block's first

    def seen(col):
        """Which cache positions `col` (any shape broadcasting against [n, 1, 1]) a row attends."""
        ok = (col <= row_start) if kn.mask_own_slot else (col < row_start)
        ok = (ok & (col > 0)) if kn.mask_first_slot else ok
        return (ok & ((col > row_pos - win) | jnp.logical_not(sliding))) if windowed else ok

    def capped(sc, ok):
        """Soft-capped scores (Gemma 2), -inf where not attended; the cap goes before the mask."""
        if kn.softcap_after_mask:  # -inf capped to -cap: masked slots join the denominator
            return ops.softcap(jnp.where(ok, sc, -jnp.inf), c.attn_softcap)
        return jnp.where(ok, ops.softcap(sc, c.attn_softcap), -jnp.inf)

    mla = (jnp.full((R * K, G, 1), -jnp.inf, F32), jnp.zeros((R * K, G, 1), F32), jnp.zeros((R * K, G, dv), F32))
    if sinks is not None and not kn.sink_dropped:  # gpt-oss: a learned logit per head joins the denominator
        sk = sinks.reshape(1, G, K).transpose(0, 2, 1) if gqa_t else sinks.reshape(1, K, G)  # head kh*G + g
        mla = (ops.reshape(jnp.broadcast_to(sk, (R, K, G)), R * K, G, 1), jnp.ones((R * K, G, 1), F32), mla[2])
    for t in range(nt):  # a tile no row attends is neither copied nor read (bitwise the same: a fully masked
        # tile adds exactly nothing to the online softmax)
        def tile_step(mla, t=t):
            for cp in kv_tile(t):
                cp.wait()
            if t + 1 < nt:
                @pl.when(t + 1 < live)
                def _():
                    for cp in kv_tile(t + 1):
                        cp.start()

            j = t % spec.kv_buffers
            kt, vt = (ops.spread(bufs[j][...], T).reshape(R * K, TS, d).astype(F32)
                      for bufs, d in ((kbufs, hd), (vbufs, dv)))
            sc = jnp.einsum("nqd,nkd->nqk", qg, kt, preferred_element_type=F32,
                            precision=ops.precision(F32))  # [n, G, TS]
            col = t * TS + jax.lax.broadcasted_iota(jnp.int32, (R * K, 1, TS), 2)
            # V is masked as well as the scores: an unwritten slot may hold anything (NaN included), and a zero
            # probability times NaN is NaN
            vt = jnp.where(seen(t * TS + jax.lax.broadcasted_iota(jnp.int32, (R * K, TS, 1), 1)), vt, 0.0)
            return ops.online_softmax_step(mla, capped(sc, seen(col)), vt)

        mla = jax.lax.cond((t >= first) & (t < live), tile_step, lambda m: m, mla)
    for t in range(0 if kn.skip_new_kv else T):  # block token t's K/V (skip_new_kv, the fault: never attended)
        kb, vb = (block_kv(a, t, d) for a, d in ((k, hd), (v, dv)))
        at = heads(blk[:, t:t + 1])  # [n, 1, 1]: its position
        ok = at <= row_pos + (1 if kn.block_mask_ahead else 0)  # causal (the fault: the next block token too)
        ok = (ok & ((at > row_pos - win) | jnp.logical_not(sliding))) if windowed else ok
        sc = jnp.einsum("nqd,nkd->nqk", qg, kb, preferred_element_type=F32, precision=ops.precision(F32))  # [n, G, 1]
        mla = ops.online_softmax_step(mla, capped(sc, ok), jnp.where(ok, vb, 0.0))
    _, lsum, acc = mla
    out = jnp.where(lsum > 0, acc / jnp.maximum(lsum, 1e-30), 0.0)  # [n, G, dv]
    return ops.reshape(out.reshape(R, K, G, dv).transpose(0, 2, 1, 3) if gqa_t else out, R, H * dv)
