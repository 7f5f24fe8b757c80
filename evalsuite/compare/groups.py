"""How `diff` cuts its prompts into generate calls: the judge's own rule, so it does not depend on how any one
engine batches internally (an engine may split a call further; the judge only chooses what it sends)."""

from __future__ import annotations

from collections.abc import Sequence

from engines.base import call_groups

# Padded prompt tokens (rows x bucketed length) per call, with rows and lengths rounded up to powers of two
# as the engines round them. The reference's prefill attention holds [rows, heads, T, T] scores: 8 rows of a
# 2048 bucket took the 24 GiB machine out of memory, 4096 keeps it under 1 GiB (measured on smollm2-135m).
TOKEN_BUDGET = 4096
# The shortest length a call is rounded up to (the engines' smallest prefill bucket): below it every
# length costs the same, so it counts as this many tokens.
MIN_LENGTH = 16


def groups(lengths: Sequence[int], max_rows: int, token_budget: int = TOKEN_BUDGET) -> list[list[int]]:
    """Split prompts (by index, in order) into calls of at most max_rows prompts and token_budget padded
    tokens; a prompt longer than the budget goes alone."""
    return call_groups(lengths, max_rows, token_budget, MIN_LENGTH)
