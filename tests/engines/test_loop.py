"""The shared batching driver: the few-shot prefix prefilled once must not change any result."""

from __future__ import annotations

import numpy as np
import pytest

from engines.loop import MIN_SHARED_PREFIX, common_prefix

# Prefix-shared prefill reorders float sums (other matmul shapes): measured max |Δ top logprob|
# 1.1e-4 on smollm2 (8 GSM8K 5-shot prompts, 48 tokens) and below 1e-5 on mini-llama. Bound 1e-3:
# f32 noise, far below any real change (a wrong position or stale KV moves logits by > 1).
PREFIX_TOL = 1e-3


def test_common_prefix():
    assert common_prefix([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3]]) == 2
    assert common_prefix([[1, 2, 3], [1, 2, 3]]) == 2  # every row keeps one own token
    assert common_prefix([[7, 1], [8, 1]]) == 0
    assert common_prefix([[4, 4, 4]]) == 2


def _shared_prompts(vocab: int, seed: int, n: int, prefix_len: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    prefix = rng.integers(3, vocab, prefix_len).tolist()
    return [prefix + rng.integers(3, vocab, int(rng.integers(1, 40))).tolist() for _ in range(n)]


@pytest.mark.parametrize("engine,model", [("reference", "mini_llama"), ("megakernel", "mini_llama"),
                                          ("megakernel", "mini_moe")])
def test_shared_prefix_matches_separate_prefill(engine, model, request):
    """Both engines prefill a prefix every prompt shares once (lm-eval's fixed exemplars); each row's
    tokens and top logprobs are those of the prompt prefilled alone."""
    from evalsuite.plugins import make_engine

    m = request.getfixturevalue(model)
    eng = make_engine(engine, m, "float32", None)
    prompts = _shared_prompts(m.config.vocab_size, seed=5, n=6, prefix_len=MIN_SHARED_PREFIX + 20)
    calls = []
    real_extend = eng._extend_step
    eng._extend_step = lambda *a, **k: calls.append(1) or real_extend(*a, **k)
    shared = eng.generate(prompts, 12, top_k=3)
    assert calls, "the shared-prefix path was not taken"
    for p, g in zip(prompts, shared):
        alone = eng.generate([p], 12, top_k=3)[0]  # one prompt: no shared prefix
        assert g.prompt_ids == p
        assert g.token_ids == alone.token_ids
        np.testing.assert_array_equal(g.top_ids, alone.top_ids)
        assert np.abs(g.top_logprobs - alone.top_logprobs).max() <= PREFIX_TOL


@pytest.mark.heavy  # the logic is test_shared_prefix_matches_separate_prefill's (mini-llama, in CI)
def test_shared_prefix_smollm2_fewshot(smollm2, smollm2_ref):
    """Real 5-shot GSM8K-style prompts: identical greedy tokens with and without prefix reuse."""
    import json
    from pathlib import Path

    data = Path(__file__).resolve().parents[2] / "tasks" / "data"
    shots = [json.loads(x) for x in (data / "gsm8k_fewshot.jsonl").read_text().splitlines()]
    qs = [json.loads(x) for x in (data / "gsm8k_sample.jsonl").read_text().splitlines()][:2]
    head = "".join(f"Question: {d['question']}\nAnswer: {d['answer']}\n\n" for d in shots)
    prompts = [smollm2.tokenizer.encode(head + f"Question: {d['question']}\nAnswer:") for d in qs]
    assert common_prefix(prompts) > 300
    shared = smollm2_ref.generate(prompts, 24, stop_ids=smollm2.tokenizer.eos_ids)
    for p, g in zip(prompts, shared):
        alone = smollm2_ref.generate([p], 24, stop_ids=smollm2.tokenizer.eos_ids)[0]
        assert g.token_ids == alone.token_ids
        assert np.abs(g.top_logprobs - alone.top_logprobs).max() <= PREFIX_TOL


@pytest.mark.parametrize("engine", ["reference", "megakernel"])
def test_stop_check_ends_rows_early(mini_llama, engine):
    """A stop_check (the adapter's stop strings) ends each row where it first holds; the tokens
    up to there are those of the unstopped run."""
    from evalsuite.plugins import make_engine

    eng = make_engine(engine, mini_llama, "float32", None)
    prompts = _shared_prompts(mini_llama.config.vocab_size, seed=9, n=3, prefix_len=4)
    full = eng.generate(prompts, 10, top_k=1)
    marks = [g.token_ids[3] for g in full]  # row r stops once it has produced its 4th token
    cut = eng.generate(prompts, 10, top_k=1, stop_check=lambda ids: len(ids) >= 4 and ids[3] in marks)
    for f, c in zip(full, cut):
        assert c.token_ids == f.token_ids[:4] and c.finish_reason == "stop"
    assert all(f.finish_reason == "length" and len(f.token_ids) == 10 for f in full)


@pytest.mark.parametrize("engine", ["reference", "megakernel"])
def test_finished_rows_leave_the_batch(mini_llama, engine):
    """Rows ending at different steps (so the batch shrinks 8 -> 4 -> 2 -> 1) give the tokens each
    prompt gives alone."""
    from evalsuite.plugins import make_engine

    eng = make_engine(engine, mini_llama, "float32", None)
    prompts = _shared_prompts(mini_llama.config.vocab_size, seed=11, n=8, prefix_len=3)
    ends = {i: 2 + 2 * i for i in range(8)}  # prompt i stops after 2 + 2i tokens
    shrunk = []
    real = eng._shrink_step
    eng._shrink_step = lambda state, keep: shrunk.append(len(keep)) or real(state, keep)
    out = eng.generate(prompts, 20, top_k=2, stop_check=lambda ids: len(ids) >= 2 and ids[0] < 0)  # never
    assert shrunk == []  # nobody finished early: no shrinking
    marks = {tuple(g.token_ids[:ends[i]]): ends[i] for i, g in enumerate(out)}
    cut = eng.generate(prompts, 20, top_k=2, stop_check=lambda ids: marks.get(tuple(ids)) == len(ids))
    assert shrunk and shrunk[-1] == 1 and all(a > b for a, b in zip(shrunk, shrunk[1:]))
    for i, (g, full) in enumerate(zip(cut, out)):
        assert g.token_ids == full.token_ids[:ends[i]] and g.finish_reason == "stop"
        assert np.abs(g.top_logprobs - full.top_logprobs[:ends[i]]).max() <= PREFIX_TOL


# The attention window (engines.loop.attention_window; the reference's cache grown by the same buckets)
# only drops cache slots no row can see: decode steps past 512 positions, which read fewer slots than
# the loop's 1,024-slot cache, must give the logits the full forward pass gives at those positions.
# Measured max |Δlogit| on mini-llama: 6.2e-6 reference, 7.6e-6 megakernel; bound 1e-3, f32 noise (a
# missing slot moves them by 1.7e-2: tried by dropping the window's last slot).
WINDOW_TOL = 1e-3


@pytest.mark.parametrize("engine", ["reference", "megakernel"])
def test_attention_window_reads_every_visible_slot(mini_llama, engine):
    from engines.loop import attention_window
    from engines.megakernel import MegakernelEngine
    from engines.reference import ReferenceEngine

    assert attention_window(np.array([600, 10]), 1024) == 768 and attention_window(np.array([20]), 1024) == 128
    assert attention_window(np.array([900]), 1024) == 1024 and attention_window(np.array([3]), 64) == 64
    eng = (ReferenceEngine if engine == "reference" else MegakernelEngine)(mini_llama.weights)
    rng = np.random.default_rng(11)
    prompts = [rng.integers(3, mini_llama.config.vocab_size, n).tolist() for n in (590, 700)]
    conts = [rng.integers(3, mini_llama.config.vocab_size, 80).tolist() for _ in prompts]  # crosses 768
    windows = []  # the megakernel's window argument; the reference's cache size (it grows its cache)
    real = eng._decode
    eng._decode = lambda *a, **k: windows.append(k.get("window") or a[3][0].shape[2]) or real(*a, **k)
    forced = eng.decode_forced(prompts, conts)
    assert {768, 1024} <= set(windows), windows  # windows below the 1,024-slot cache were used
    full = ReferenceEngine(mini_llama.weights).score([p + c for p, c in zip(prompts, conts)])
    worst = max(float(np.max(np.abs(f - s.logits[len(p) - 1:len(p) - 1 + len(c)])))
                for f, s, p, c in zip(forced, full, prompts, conts))
    print(f"{engine}: max |Δlogit| {worst:.2e} over windows {sorted(set(windows))}")
    assert worst < WINDOW_TOL, f"max |Δlogit| {worst:.2e}"


@pytest.mark.parametrize("engine", ["reference", "megakernel"])
def test_shared_context_is_prefilled_once(mini_llama, engine):
    """Loglikelihood rows with the same context (one per multiple-choice answer) prefill it once and copy
    the cache row; every row's logits are those of prefilling every row (same math per row)."""
    from engines.loop import Steps, forced_all
    from evalsuite.plugins import make_engine

    eng = make_engine(engine, mini_llama, "float32", None)
    rng = np.random.default_rng(3)
    ctx = [rng.integers(3, mini_llama.config.vocab_size, n).tolist() for n in (40, 55)]
    prompts = [ctx[0]] * 4 + [ctx[1]] * 4
    conts = [rng.integers(3, mini_llama.config.vocab_size, int(rng.integers(1, 4))).tolist() for _ in prompts]
    rows = []
    real = eng._prefill_step
    eng._prefill_step = lambda tokens, *a: rows.append(tokens.shape[0]) or real(tokens, *a)
    shared = eng.decode_forced(prompts, conts)
    assert rows == [2], rows  # two distinct contexts, one prefill call of two rows
    alone = forced_all(Steps(real, eng._decode_step), prompts, conts, 32)  # no shrink: every row prefilled
    for a, b in zip(shared, alone):
        assert a.shape == b.shape and float(np.max(np.abs(a - b))) < 1e-4  # measured: 0.0 both engines


@pytest.mark.parametrize("engine", ["reference", "megakernel"])
@pytest.mark.parametrize("prefix_len", [0, MIN_SHARED_PREFIX + 8])
def test_continuous_batching_matches_each_prompt_alone(mini_llama, engine, prefix_len):
    """More prompts than the engine's real rows (its max_batch), answers of many lengths: finished rows are
    refilled with waiting prompts, two or more at once (their K/V written into the freed rows); every prompt's
    tokens and top logprobs are those it gets alone, and on_result reports each prompt once, as it finishes."""
    from engines.base import PathLog
    from engines.loop import Steps, greedy_all
    from evalsuite.plugins import make_engine

    eng = make_engine(engine, mini_llama, "float32", None)
    rows = eng.max_batch
    rng = np.random.default_rng(21)
    V = mini_llama.config.vocab_size
    head = rng.integers(3, V, prefix_len).tolist()
    prompts = [head + rng.integers(3, V, int(rng.integers(1, 30))).tolist() for _ in range(rows + rows // 2 + 3)]
    stop_check = lambda ids: len(ids) >= 2 + ids[0] % 11  # noqa: E731  (answer lengths 2..12, row by row)
    inserts, reported, log = [], [], PathLog()
    insert = lambda state, *a: inserts.append(state is not None) or eng._insert_step(state, *a)  # noqa: E731
    extend = eng._extend_step if prefix_len else None
    gens = greedy_all(Steps(eng._prefill_step, eng._decode_step, extend, insert, eng._shrink_step), prompts, 12, (),
                      3, False, rows, stop_check=stop_check, on_result=lambda i, g: reported.append((i, g)), log=log)
    assert sum(inserts) >= 2, "no row was refilled"
    assert log.counts.get("refill_group"), log.counts  # a refill of two or more rows at once
    assert log.counts.get("shrink"), log.counts
    assert sorted(i for i, _ in reported) == list(range(len(prompts)))
    assert all(gens[i] is g for i, g in reported)
    lengths = {len(g.token_ids) for g in gens}
    assert len(lengths) >= 3, lengths
    for p, g in zip(prompts, gens):
        alone = greedy_all(Steps(eng._prefill_step, eng._decode_step), [p], 12, (), 3, False, rows,
                           stop_check=stop_check)[0]
        assert g.prompt_ids == p
        assert g.token_ids == alone.token_ids
        np.testing.assert_array_equal(g.top_ids, alone.top_ids)
        assert np.abs(g.top_logprobs - alone.top_logprobs).max() <= PREFIX_TOL
        assert g.finish_reason == alone.finish_reason
