"""Shape buckets: the row and length rounding that bounds how many programs an engine compiles."""

from __future__ import annotations

from collections.abc import Sequence


def next_pow2(n: int, minimum: int = 1) -> int:
    """Smallest power of two >= max(n, minimum): the shape buckets that bound recompilation."""
    n = max(n, minimum)
    return 1 << (n - 1).bit_length()


def call_groups(lengths: Sequence[int], max_rows: int, token_budget: int, min_length: int) -> list[list[int]]:
    """Split rows (by index, in order) into calls of at most max_rows rows and token_budget padded tokens, rows and
    lengths rounded up to powers of two (lengths from min_length); a row longer than the budget goes alone."""
    out: list[list[int]] = []
    cur: list[int] = []
    for i, n in enumerate(lengths):
        longest = max([lengths[j] for j in cur] + [n])
        if cur and (len(cur) >= max_rows or next_pow2(len(cur) + 1) * next_pow2(longest, min_length) > token_budget):
            out.append(cur)
            cur = []
        cur.append(i)
    if cur:
        out.append(cur)
    return out


def next_bucket(n: int, minimum: int = 1) -> int:
    """next_pow2, with 3 * 2^k added from 384 up (384, 768, 1536, ...): at long lengths a bucket wastes at
    most a third instead of half, and every bucket from 256 up is still a multiple of 128."""
    p = next_pow2(n, minimum)
    return 3 * p // 4 if p >= 512 and 3 * p // 4 >= max(n, minimum) else p
