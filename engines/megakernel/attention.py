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


def window(spec: KernelSpec) -> tuple[bool, int]:
    """(whether any layer slides, a sliding layer's reach: its query at p sees p - reach + 1 .. p)."""
    c = spec.config
    return "sliding" in c.layer_kinds, c.sliding_window + spec.knobs.window_offset


def n_tiles(spec: KernelSpec) -> int:
    """The tiles of the window the step reads (the skip_last_tile fault drops the last of two or more)."""
    n = (spec.window or spec.slots) // spec.tile
    return n - (1 if spec.knobs.skip_last_tile and n > 1 else 0)


def attend(spec: KernelSpec, q, k, v, pos_v, sliding, first, live, kv_tile, kbufs, vbufs, sinks, mla: bool = False):
    """q [B, H*dk], the new token's k [B, K*dk], v [B, K*dv] (as the cache holds them), pos_v [B, 1]; sliding
    (traced) the layer's kind; tiles first .. live-1 are read (kv_tile(t): tile t's two copies into buffer
    t % kv_buffers); sinks [1, H] or None. mla: an MLA layer's (K = H heads, keys n + r wide, values v wide:
    spec.cache_dims). Returns the heads' outputs [B, H*dv] float32.

    n = B*K groups of G query heads (head kh*G + g of row b -> group b*K + kh, row g). The new token's K/V is
    attended last (the cache tiles cover positions < p only), so no VMEM copy of the cache is ever written. The
    tile loop is static: a traced loop made the generic interpreter carry (and copy) every scratch buffer per
    iteration, 5x slower at batch 8."""
    c, kn = spec.config, spec.knobs
    B, H, TS = spec.batch, c.n_heads, spec.tile
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
    qg = ops.reshape(ops.reshape(q, B, G, K, hd).transpose(0, 2, 1, 3) if gqa_t else q, B * K, G, hd) * scale
    row_pos = jnp.repeat(pos_v, K, axis=0)[:, :, None]  # [n, 1, 1]

    def seen(col):
        """Which cache positions `col` (any shape broadcasting against [n, 1, 1]) a row attends."""
        ok = (col <= row_pos) if kn.mask_own_slot else (col < row_pos)
        ok = (ok & (col > 0)) if kn.mask_first_slot else ok
        return (ok & ((col > row_pos - win) | jnp.logical_not(sliding))) if windowed else ok

    def capped(sc, ok):
        """Soft-capped scores (Gemma 2), -inf where not attended; the cap goes before the mask."""
        if kn.softcap_after_mask:  # -inf capped to -cap: masked slots join the denominator
            return ops.softcap(jnp.where(ok, sc, -jnp.inf), c.attn_softcap)
        return jnp.where(ok, ops.softcap(sc, c.attn_softcap), -jnp.inf)

    mla = (jnp.full((B * K, G, 1), -jnp.inf, F32), jnp.zeros((B * K, G, 1), F32), jnp.zeros((B * K, G, dv), F32))
    if sinks is not None and not kn.sink_dropped:  # gpt-oss: a learned logit per head joins the denominator
        sk = sinks.reshape(1, G, K).transpose(0, 2, 1) if gqa_t else sinks.reshape(1, K, G)  # head kh*G + g
        mla = (ops.reshape(jnp.broadcast_to(sk, (B, K, G)), B * K, G, 1), jnp.ones((B * K, G, 1), F32), mla[2])
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
            kt = kbufs[j][...].reshape(B * K, TS, hd).astype(F32)
            vt = vbufs[j][...].reshape(B * K, TS, dv).astype(F32)
            sc = jnp.einsum("nqd,nkd->nqk", qg, kt, preferred_element_type=F32,
                            precision=ops.precision(F32))  # [n, G, TS]
            col = t * TS + jax.lax.broadcasted_iota(jnp.int32, (B * K, 1, TS), 2)
            # V is masked as well as the scores: an unwritten slot may hold anything (NaN included), and a zero
            # probability times NaN is NaN
            vt = jnp.where(seen(t * TS + jax.lax.broadcasted_iota(jnp.int32, (B * K, TS, 1), 1)), vt, 0.0)
            return ops.online_softmax_step(mla, capped(sc, seen(col)), vt)

        mla = jax.lax.cond((t >= first) & (t < live), tile_step, lambda m: m, mla)
    if not kn.skip_new_kv:  # the fault: the newest entry is never attended to
        sc = jnp.einsum("nqd,nkd->nqk", qg, ops.reshape(k, B * K, 1, hd), preferred_element_type=F32,
                        precision=ops.precision(F32))  # [n, G, 1]
        mla = ops.online_softmax_step(mla, ops.softcap(sc, c.attn_softcap), ops.reshape(v, B * K, 1, dv))
    _, lsum, acc = mla
    out = jnp.where(lsum > 0, acc / jnp.maximum(lsum, 1e-30), 0.0)  # [n, G, dv]
    return ops.reshape(out.reshape(B, K, G, dv).transpose(0, 2, 1, 3) if gqa_t else out, B, H * dv)
