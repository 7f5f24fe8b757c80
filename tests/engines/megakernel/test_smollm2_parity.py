"""The megakernel on the real SmolLM2-135M weights: greedy parity with the reference."""

from __future__ import annotations

import numpy as np
import pytest

from engines.megakernel import MegakernelEngine

pytestmark = pytest.mark.slow

N_TOKENS = 32
RAW = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Here is a shopping list:\n1. Milk\n2.",
    "12 + 35 =",
    "The three primary colors are",
    "In 1969, the first humans to walk on the Moon were",
]
CHAT = [
    "What is 17 times 3?",
    "Write a haiku about autumn leaves.",
    "List four planets of the solar system.",
    "Explain what a hash table is in one sentence.",
    "Translate 'good morning' into French.",
    "Write a Python function that reverses a string.",
]


@pytest.fixture(scope="module")
def prompts(smollm2):
    tok = smollm2.tokenizer
    return [tok.encode(p) for p in RAW] + [tok.encode_chat(p) for p in CHAT]


def test_f32_greedy_identical_on_8_prompts(smollm2, smollm2_ref, prompts):
    """Four raw and four chat prompts in CI (54 s for all 12; test_bf16_report, heavy, keeps the 12)."""
    prompts = prompts[:4] + prompts[len(RAW):len(RAW) + 4]
    want = smollm2_ref.generate(prompts, N_TOKENS)
    got = MegakernelEngine(smollm2.weights).generate(prompts, N_TOKENS)
    same = [a.token_ids == b.token_ids for a, b in zip(want, got)]
    print(f"f32: {sum(same)}/{len(same)} prompts identical over {N_TOKENS} tokens")
    assert all(same)
    worst = max(float(np.abs(a.top_logprobs - b.top_logprobs).max()) for a, b in zip(want, got))
    assert worst <= 1e-3  # measured 4.2e-5 on two prompts in development


def first_divergence(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


@pytest.mark.heavy
def test_bf16_report(smollm2, smollm2_ref, prompts):
    """bf16 kernel vs the f32 reference: how many prompts stay identical, where the rest diverge.
    A report, not a bound: near-tie divergence is expected in bf16 and is judged by `diff` (issue 4).
    The assertion only checks that the first token (from the XLA prefill) is the same everywhere."""
    want = smollm2_ref.generate(prompts, N_TOKENS)
    got = MegakernelEngine(smollm2.weights, "bfloat16").generate(prompts, N_TOKENS)
    firsts = [first_divergence(a.token_ids, b.token_ids) for a, b in zip(want, got)]
    print(f"bf16: {firsts.count(None)}/{len(firsts)} identical over {N_TOKENS} tokens; "
          f"first divergences at {sorted(f for f in firsts if f is not None)}")
    agree_first = sum(a.token_ids[0] == b.token_ids[0] for a, b in zip(want, got))
    assert agree_first >= len(prompts) - 1
