"""The judge's grouping of prompts into generate calls: its own rule, and the same calls diff sent when it
borrowed the reference loop's batching (so every committed figure keeps its batches)."""

import numpy as np

from engines.loop import batches
from evalsuite.compare.groups import TOKEN_BUDGET, groups


def test_same_calls_as_the_loops_batching_on_random_lengths():
    rng = np.random.default_rng(0)
    for _ in range(300):
        lengths = [int(x) for x in rng.integers(1, 3000, size=int(rng.integers(1, 40)))]
        rows = int(rng.integers(1, 33))
        assert groups(lengths, rows) == batches(lengths, rows)


def test_limits_rows_and_padded_tokens():
    assert groups([10] * 9, 4) == [[0, 1, 2, 3], [4, 5, 6, 7], [8]]
    # 2 rows of a 2048 bucket fill the budget; a third row would round to 4 rows
    assert groups([2000, 2000, 2000], 8) == [[0, 1], [2]]
    assert groups([TOKEN_BUDGET + 1, 5], 8) == [[0], [1]]  # longer than the budget: alone
    assert groups([], 8) == []
