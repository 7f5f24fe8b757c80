"""Lazy safetensors weights (engines.lazy): the same arrays and sha256 as an eager load, and a slice reads only
its own elements."""

from __future__ import annotations

import numpy as np
import pytest

from engines.hf_loader import load_hf
from evalsuite.models import minis_dir


@pytest.mark.parametrize("name", ["mini-qwen2", "mini-gemma3", "mini-gptoss", "mini-qwen-hybrid", "mini-kimi-linear",
                                  "mini-deepseek-mla"])
def test_lazy_equals_eager(name):
    eager, lazy = load_hf(minis_dir() / name, name), load_hf(minis_dir() / name, name, lazy=True)
    assert lazy.lazy and not eager.lazy
    assert (lazy.sha256, lazy.n_params, lazy.nbytes) == (eager.sha256, eager.n_params, eager.nbytes)
    for key in eager.arrays:
        assert np.array_equal(lazy.arrays[key], eager.arrays[key]), key


def test_a_slice_reads_only_itself():
    w = load_hf(minis_dir() / "mini-qwen2", "mini-qwen2", lazy=True)
    wq, wo = w.arrays.lazy("wq"), w.arrays.lazy("wo")  # (in, out) views of HF's (out, in) tensors
    assert w.arrays.bytes_read == 0  # loading read headers and hashed the file, no tensor
    L, D, Q = wq.shape
    part = wq[(1, slice(None), slice(0, Q // 2))]  # layer 1, the first half of the heads' columns
    assert part.shape == (D, Q // 2) and w.arrays.bytes_read == part.nbytes
    assert np.array_equal(part, load_hf(minis_dir() / "mini-qwen2", "mini-qwen2").arrays["wq"][1, :, :Q // 2])
    rows = wo[(0, slice(Q // 2, Q), slice(None))]  # rows over tp: HF's columns
    assert rows.shape == (Q // 2, D) and w.arrays.bytes_read == part.nbytes + rows.nbytes
