"""The megakernel's own math on arrays (used inside the kernel body and by its XLA prefill).

Written separately from engines/reference on purpose: the judge and the judged share the Config
and the weights, never the math. Formulations differ where it is natural: RoPE takes each dimension's
partner by lane rolls and a select (Mosaic's native lane rotate, no strided slices), routing picks
experts by repeated masked max instead of top_k, attention is an online softmax over tiles.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

F32 = jnp.float32


def precision(dtype) -> jax.lax.Precision:
    """The kernel's own matmul precision, never the process's default: float32 at full precision (a TPU's default
    is bf16 passes), bfloat16 operands as they are (Mosaic refuses a bf16 matmul asked for fp32 precision)."""
    return jax.lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else jax.lax.Precision.DEFAULT


def mm(a: jax.Array, w: jax.Array) -> jax.Array:
    """a @ w with a cast to the weight dtype (bf16 mode feeds bf16 to the MXU), f32 accumulation."""
    return jnp.dot(a.astype(w.dtype), w, preferred_element_type=F32, precision=precision(w.dtype))


def reshape(x: jax.Array, *shape: int) -> jax.Array:
    """x.reshape(shape) in steps Mosaic lays out: one that changes the lane (last) dim only splits or merges it with
    every dim above it kept, and one that keeps the lane dim may regroup the dims above it; a reshape that does both
    at once ([B, H*hd] -> [B*K, G, hd]) is refused ("unsupported shape cast", on a TPU v5e, jax 0.10.2). Between
    the two steps an add of zero keeps Mosaic from folding them back into one (no change to any value but the sign
    of a zero)."""
    shape = tuple(int(d) for d in shape)
    if -1 in shape:
        known = int(np.prod([d for d in shape if d != -1]))
        shape = tuple(x.size // known if d == -1 else d for d in shape)
    lane, to = x.shape[-1], shape[-1]
    if x.shape == shape or lane == to or (lane % to and to % lane):
        return x.reshape(shape)
    if to < lane:  # split the lanes first, then regroup above them
        mid = (*x.shape[:-1], lane // to, to)
    else:  # regroup above the lanes first, then merge them
        mid = (*shape[:-1], to // lane, lane)
    if mid in (x.shape, shape):
        return x.reshape(shape)
    return (x.reshape(mid) + jnp.zeros((), x.dtype)).reshape(shape)


def round_to(x: jax.Array, dtype) -> jax.Array:
    """x (float32) rounded to dtype's precision, kept in float32 (a no-op for float32). bfloat16 by integer ops on
    the bits (round to nearest even: add 0x7FFF plus the kept lowest bit, clear the low 16): XLA may fold an astype
    pair away as excess precision, and Mosaic has no lowering for lax.reduce_precision. Finite values only."""
    fi = jnp.finfo(dtype)
    if fi.bits >= 32:
        return x
    if jnp.dtype(dtype) != jnp.bfloat16:
        return jax.lax.reduce_precision(x, exponent_bits=fi.nexp, mantissa_bits=fi.nmant)
    u = jax.lax.bitcast_convert_type(x, jnp.uint32)
    u = (u + jnp.uint32(0x7FFF) + ((u >> 16) & jnp.uint32(1))) & jnp.uint32(0xFFFF0000)
    return jax.lax.bitcast_convert_type(u, jnp.float32)


def online_softmax_step(mla, scores, values):
    """Fold one tile into a running softmax: mla = (max [n,G,1], sum [n,G,1], acc [n,G,hd]);
    scores [n, G, TS] (-inf where masked), values [n, TS, hd]. A start of (sink, 1, 0) is a sink's logit already
    in the denominator."""
    m, lsum, acc = mla
    m_new = jnp.maximum(m, jnp.max(scores, axis=-1, keepdims=True))
    m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)  # a fully masked tile adds nothing
    alpha = jnp.exp(m - m_safe)
    pr = jnp.exp(scores - m_safe)
    return (m_new, lsum * alpha + jnp.sum(pr, axis=-1, keepdims=True),
            acc * alpha + jnp.einsum("nqk,nkd->nqd", pr, values, preferred_element_type=F32,
                                    precision=precision(F32)))


def rounder(rounds: tuple[str, ...]):
    """(x, point) -> x rounded to bf16 where the declared recipe rounds at point (engines.recipe.ROUND_POINTS)."""
    return lambda x, point: round_to(x, jnp.bfloat16) if point in rounds else x


def rmsnorm(x: jax.Array, w: jax.Array | None, eps: float, width: int = 0) -> jax.Array:
    """x [N, D] float32, w [1, D] float32 (None: no weight, Muse's parameter-free norms); width: the mean's divisor
    where it is not D (the latent_norm_padded fault's padded width)."""
    ms = jnp.sum(x * x, axis=-1, keepdims=True) / width if width else jnp.mean(x * x, axis=-1, keepdims=True)
    y = x * jax.lax.rsqrt(ms + eps)
    return y if w is None else y * w


# Muse Spark's post-norms' eps (its config's post_eps: the residual branches' and each expert's output's), its
# gate's temperature and alpha's floor
MUSE_POST_EPS, GATE_TEMPERATURE, ALPHA_FLOOR = 1e-8, 0.3, 1e-3


def residual(c, x: jax.Array, y: jax.Array, branch: str, get, eps: float) -> jax.Array:
    """The stream x [N, D] updated by branch "attn" or "mlp"'s output y; get(key) reads one of the layer's arrays.
    Plain: x + y (Gemma: y normed by post_<branch>_norm first). Muse's gated residual: alpha x + beta rms(y w) per
    channel (w the MLP's post-norm scale; the attention's norm has none), u = g / 0.3 with g the branch's learned
    res_gate vector, beta = sigmoid(u), alpha = sqrt(max(sigmoid(-u) (1 + beta), 1e-3))."""
    if not c.residual_gates:
        return x + (rmsnorm(y, get(f"post_{branch}_norm"), eps) if c.post_norms else y)
    u = get(f"res_gate_{branch}") / GATE_TEMPERATURE
    beta = jax.nn.sigmoid(u)
    alpha = jnp.sqrt(jnp.maximum(jax.nn.sigmoid(-u) * (1.0 + beta), ALPHA_FLOOR))
    return alpha * x + beta * rmsnorm(y * get("post_mlp_norm") if branch == "mlp" else y, None, MUSE_POST_EPS)


def rope_freqs(c, kind: str, theta_factor: float = 1.0) -> tuple[np.ndarray, float]:
    """The rotation frequency of each of a "full" or "sliding" layer's r/2 pairs (float64) and the factor on its
    q.k scores, from the scalings' published definitions. Sliding layers with their own base (Gemma 3's
    rope_theta_local) are plain and unscaled; otherwise the Config's scaling applies to every layer (gpt-oss).
    theta_factor multiplies the base (the rope_theta fault).
      linear: every frequency / factor.
      llama3: wavelengths under orig / high_freq_factor kept, over orig / low_freq_factor / factor, a blend
        between (weight orig / wavelength, rescaled from [low, high] to [0, 1]).
      yarn (Peng et al.): pair i keeps its frequency when it turns more than beta_fast times within the original
        context, is / factor when under beta_slow times, a linear blend between (the pair indices of those two
        counts, floored and ceiled unless truncate is false); the scores grow by mscale^2, mscale = 0.1 ln(factor) + 1
        (or attention_factor, or the ratio of the two mscales DeepSeek's configs give).
    """
    r = c.rope_dim
    local = kind == "sliding" and c.rope_theta_local
    theta = (c.rope_theta_local if local else c.rope_theta) * theta_factor
    freq = theta ** (-np.arange(0, r, 2, dtype=np.float64) / r)
    s = {} if local else dict(c.rope_scaling)
    kind_of = s.get("type")
    if not kind_of:
        return freq, 1.0
    factor = float(s["factor"])
    if kind_of == "linear":
        return freq / factor, 1.0
    orig = float(s.get("original_max_position_embeddings") or c.max_context)
    if kind_of == "llama3":
        lo, hi = float(s["low_freq_factor"]), float(s["high_freq_factor"])
        wave = 2 * np.pi / freq
        blend = np.clip((orig / wave - lo) / (hi - lo), 0.0, 1.0)  # 1: kept, 0: / factor
        return np.where(wave < orig / hi, freq, np.where(wave > orig / lo, freq / factor,
                                                          blend * freq + (1 - blend) * freq / factor)), 1.0

    def pair_turning(times: float) -> float:  # the pair index whose wavelength fits `times` times in orig
        return r * np.log(orig / (times * 2 * np.pi)) / (2 * np.log(theta))

    a, b = pair_turning(float(s.get("beta_fast") or 32)), pair_turning(float(s.get("beta_slow") or 1))
    if s.get("truncate", True):
        a, b = np.floor(a), np.ceil(b)
    a, b = max(a, 0.0), min(b, r - 1.0)
    b = b + 0.001 if a == b else b
    keep = 1.0 - np.clip((np.arange(r // 2) - a) / (b - a), 0.0, 1.0)
    mscale = lambda m: 1.0 if factor <= 1 else 0.1 * m * np.log(factor) + 1.0  # noqa: E731
    att = s.get("attention_factor")
    if att is None:
        m, m_all = s.get("mscale"), s.get("mscale_all_dim")
        att = mscale(float(m)) / mscale(float(m_all)) if m and m_all else mscale(1.0)
    return keep * freq + (1 - keep) * freq / factor, float(att) ** 2


def rope_tables(style: str, head_dim: int, n_heads: int, freqs: np.ndarray,
                rotary_dim: int = 0) -> tuple[np.ndarray, np.ndarray, int]:
    """For rotating a row of n_heads heads at once: rot(x) = x*cos(p*f) + partner(x)*sin(p*f), where
    partner(x)[a] = -x[a + shift] on the first dimension of each pair and x[b - shift] on the second.

    freqs [r/2]: pair i's frequency (rope_freqs). Returns first [1, n_heads*hd] (1.0 on each pair's first
    dimension), f [1, n_heads*hd] (each dimension's frequency; 0 on dimensions past rotary_dim, which the rotation
    then leaves as they are) and shift: interleaved: pairs (2i, 2i+1), shift 1; half: pairs (i, i+r/2), shift r/2
    (r = rotary_dim or hd). No pair crosses a head, so rolling the whole row never mixes heads.
    """
    r = rotary_dim or head_dim
    half = r // 2
    first = np.zeros(head_dim, np.float32)
    freq = np.zeros(head_dim, np.float64)
    for i in range(half):
        a, b = (2 * i, 2 * i + 1) if style == "interleaved" else (i, i + half)
        first[a] = 1.0
        freq[a] = freq[b] = freqs[i]
    shift = 1 if style == "interleaved" else half
    return np.tile(first, n_heads)[None, :], np.tile(freq, n_heads).astype(np.float32)[None, :], shift


def rope_shift(c) -> int:
    """The distance between a dimension and its rotation partner (static; rope_tables' third value)."""
    return 1 if c.rope_style == "interleaved" else c.rope_dim // 2


def rope(x: jax.Array, pos: jax.Array, first: jax.Array, freq: jax.Array, shift: int, roll=jnp.roll) -> jax.Array:
    """x [N, heads*hd] float32, pos [N, 1] int32. The rotation partner comes from two lane rolls and a select
    (no [H*hd, H*hd] permutation matmul); roll(x, s, axis) is jnp.roll's direction (pltpu.roll in the kernel)."""
    n = x.shape[-1]
    ang = pos.astype(F32) * freq  # [N, heads*hd]
    partner = jnp.where(first > 0, -roll(x, n - shift, 1), roll(x, shift, 1))
    return x * jnp.cos(ang) + partner * jnp.sin(ang)


def gelu_tanh(a: jax.Array) -> jax.Array:
    """GELU by its tanh approximation: a/2 (1 + tanh(sqrt(2/pi) (a + 0.044715 a^3)))."""
    return 0.5 * a * (1.0 + jnp.tanh(0.7978845608028654 * (a + 0.044715 * a * a * a)))


def situ(g: jax.Array, u: jax.Array) -> jax.Array:
    """Kimi K3's gated activation: 4 tanh(g/4) sigmoid(g) 25 tanh(u/25), both soft-capped, the sigmoid on the raw g."""
    return 4.0 * jnp.tanh(g / 4.0) * jax.nn.sigmoid(g) * 25.0 * jnp.tanh(u / 25.0)


def swiglu(h: jax.Array, g: jax.Array, u: jax.Array, d: jax.Array, gelu: bool = False, k3: bool = False,
           rounded: bool = False) -> jax.Array:
    """act(h g) * (h u), then d; act SiLU, or tanh-GELU with gelu (Gemma's GeGLU; the gelu_mlp fault's swap); k3:
    situ(h g, h u) (Kimi K3), rounded: its two projections and its output rounded to bf16 as a routed expert's are
    (the recipe's latent_moe point on K3's shared expert)."""
    a = mm(h, g)
    if k3:
        rd = rounder(("latent_moe",) if rounded else ())
        return rd(mm(situ(rd(a, "latent_moe"), rd(mm(h, u), "latent_moe")), d), "latent_moe")
    act = gelu_tanh(a) if gelu else a * jax.nn.sigmoid(a)
    return mm(act * mm(h, u), d)


def depth_mix(w: jax.Array, blocks: list, n, prefix: jax.Array, eps: float, rounded: bool = False) -> jax.Array:
    """Kimi K3's attention residuals: sum_i softmax_i(s_i) v_i over v = blocks[:n] + [prefix], s_i = (v_i . w) /
    rms(v_i); blocks a list of [N, D] (n traced or static), prefix [N, D], w [1, D]; float32, blocks first then the
    prefix, in that fixed order. rounded: the result rounded to bf16 (the recipe's attn_res point)."""
    def score(v):
        return jnp.sum(v * w, -1, keepdims=True) * jax.lax.rsqrt(jnp.mean(v * v, -1, keepdims=True) + eps)

    sp = score(prefix)
    sb = [score(v) for v in blocks]
    valid = [j < n for j in range(len(blocks))]
    top = sp
    for ok, s in zip(valid, sb):
        top = jnp.where(ok, jnp.maximum(top, s), top)
    e = [jnp.where(ok, jnp.exp(s - top), 0.0) for ok, s in zip(valid, sb)]
    ep = jnp.exp(sp - top)
    den, acc = 0.0, 0.0
    for ok, ej, v in zip(valid, e, blocks):  # a block past n may hold anything: it never enters the sum
        den, acc = den + ej, acc + jnp.where(ok, ej * v, 0.0)
    out = (acc + ep * prefix) / (den + ep)
    return round_to(out, jnp.bfloat16) if rounded else out


def expert(h: jax.Array, e: dict, act: str = "swiglu", alpha: float = 1.702, limit: float = 7.0,
           rounded: bool = False) -> jax.Array:
    """One routed expert on h [N, D]: e holds e_gate, e_up, e_down (and gpt-oss's biases e_gate_b, e_up_b,
    e_down_b, [1, X] rows). act "gptoss": the gate clamped above at limit, up to [-limit, limit], then
    gate * sigmoid(alpha * gate) * (up + 1); else SiLU(gate) * up. rounded: its gate and up projections and its
    output rounded to bf16 as they leave their matmuls (the recipe's latent_moe point)."""
    rd = rounder(("latent_moe",) if rounded else ())
    g, u = rd(mm(h, e["e_gate"]), "latent_moe"), rd(mm(h, e["e_up"]), "latent_moe")
    if "e_gate_b" in e:
        g, u = g + e["e_gate_b"], u + e["e_up_b"]
    if act == "gptoss":
        g, u = jnp.minimum(g, limit), jnp.clip(u, -limit, limit)
        a = g * jax.nn.sigmoid(alpha * g) * (u + 1.0)
    elif act == "situ":  # Kimi K3
        a = situ(g, u)
    else:
        a = g * jax.nn.sigmoid(g)
        a = a * u
    y = mm(a, e["e_down"])
    return rd(y + e["e_down_b"] if "e_down_b" in e else y, "latent_moe")


def softcap(s: jax.Array, cap: float) -> jax.Array:
    """cap * tanh(s / cap) (Gemma 2's scores and logits); cap 0: s."""
    return cap * jnp.tanh(s / cap) if cap else s


def embed_scale(c) -> float:
    """What the embedded token is multiplied by: sqrt(hidden) for Gemma, else 1."""
    return float(np.float32(c.hidden ** 0.5)) if c.embed_scale else 1.0


def embedded(c, embed: jax.Array, ids: jax.Array) -> jax.Array:
    """The stream's start for token ids [N]: embed[ids] in float32 (Muse: RMS-normed, no weight), times
    embed_scale."""
    x = embed[ids].astype(F32)
    return (rmsnorm(x, None, c.rms_eps) if c.embed_norm else x) * embed_scale(c)


def chosen_ids(gates: jax.Array, shape: tuple[int, int], n: int) -> jax.Array:
    """The distinct experts any row chose (gates [N, E], nonzero where chosen), ascending, in the first n lanes of
    an int32 [1, lanes] vector; E in the lanes past them. By repeated masked min (no sort, no gather)."""
    E = gates.shape[-1]
    iota = jax.lax.broadcasted_iota(jnp.int32, (1, E), 1)
    lane = jax.lax.broadcasted_iota(jnp.int32, shape, 1)
    left = jnp.where(jnp.max(jnp.where(gates != 0, 1, 0), axis=0, keepdims=True) > 0, iota, E)  # [1, E]
    ids = jnp.full(shape, E, jnp.int32)
    for j in range(n):
        first = jnp.min(left, axis=-1, keepdims=True)
        ids = jnp.where(lane == j, first, ids)
        left = jnp.where(iota == first, E, left)
    return ids


def pick_experts(logits: jax.Array, bias: jax.Array, *, router: str, top_k: int, norm_topk: bool,
                 scale: float, skip_first: bool = False, bias_in_weights: bool = False, logit_scale: float = 1.0,
                 eps: float = 0.0) -> jax.Array:
    """Dense gate weights [N, E] from router logits [N, E] (zero outside the chosen experts).

    Chosen by repeated masked max (ties: lowest expert index). logit_scale multiplies the logits first and eps joins
    the renormalising sum (Muse: 2^-2.5 and 1e-15). skip_first drops the best-ranked
    expert and takes ranks 2..k+1 (the router_second_choice fault); bias_in_weights: the sigmoid router's bias,
    which selects only, also enters the weights (the router_bias_in_weights fault).
    """
    n, e = logits.shape
    logits = logits * logit_scale if logit_scale != 1.0 else logits
    if router == "softmax":  # gpt-oss's router has a bias (Qwen's are zeros)
        logits = logits + bias
        z = logits - jnp.max(logits, axis=-1, keepdims=True)
        scores = jnp.exp(z) / jnp.sum(jnp.exp(z), axis=-1, keepdims=True)
        choice = scores
    else:
        scores = 1.0 / (1.0 + jnp.exp(-logits))
        choice = scores + bias
    iota = jax.lax.broadcasted_iota(jnp.int32, (n, e), 1)
    chosen = jnp.zeros((n, e), F32)
    remaining = choice
    for rank in range(top_k + int(skip_first)):
        best = jnp.max(remaining, axis=-1, keepdims=True)
        first = jnp.min(jnp.where(remaining == best, iota, e), axis=-1, keepdims=True)
        hit = iota == first
        if not (skip_first and rank == 0):
            chosen = jnp.where(hit, 1.0, chosen)
        remaining = jnp.where(hit, -jnp.inf, remaining)
    w = chosen * (choice if bias_in_weights else scores)
    if norm_topk:
        w = w / (jnp.sum(w, axis=-1, keepdims=True) + eps)
    return w * scale


def _one_hot(n: int, m: int, hit) -> jax.Array:
    """[n, m] float32: 1 where hit(row iota, column iota)."""
    r = jax.lax.broadcasted_iota(jnp.int32, (n, m), 0)
    return hit(r, jax.lax.broadcasted_iota(jnp.int32, (n, m), 1)).astype(F32)


def _select(sel: jax.Array, x: jax.Array) -> jax.Array:
    """sel @ x for a 0/1 sel with at most one 1 a row, at full float32 precision: exact for finite x (one product by
    1 and sums of zeros), and a matmul, which Mosaic lays out where a strided row slice is refused."""
    y = jnp.dot(sel, x.reshape(x.shape[0], -1).astype(F32), preferred_element_type=F32,
                precision=jax.lax.Precision.HIGHEST)
    return y.reshape(sel.shape[0], *x.shape[1:])


def rows_of(x: jax.Array, t: int, T: int) -> jax.Array:
    """Rows t, T + t, 2T + t, .. of x [B*T, ...] (block token t of each cache row): [B, ...], float32."""
    B = x.shape[0] // T
    return _select(_one_hot(B, B * T, lambda b, r: r == b * T + t), x)


def interleave(xs: list) -> jax.Array:
    """Block token t's rows xs[t] [B, X] back into the rows b*T + t of one [B*T, X] (the inverse of rows_of)."""
    T, B = len(xs), xs[0].shape[0]
    return sum(_select(_one_hot(B * T, B, lambda r, b, t=t: r == b * T + t), x) for t, x in enumerate(xs))
