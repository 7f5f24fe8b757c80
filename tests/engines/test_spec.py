"""The speculative engine on the MINI models in float32: whatever the drafter proposes, the committed stream is the
target's plain greedy stream token for token, and each of its faults changes it with a draft that reaches the
fault's branch (the sweep drafter reaches every acceptance length)."""

from __future__ import annotations

import numpy as np
import pytest

from engines.base import EngineOptions
from engines.errors import ModelError
from engines.spec import SpeculativeEngine
from engines.spec.drafters import lookup
from engines.spec.engine import KERNEL_FAULTS
from evalsuite.models import load_model
from evalsuite.prompts import load_prompts

N = 16  # tokens a prompt: several rounds of every acceptance length in a block of 4


def _setup(name: str, n_prompts: int = 6):
    from engines.reference import ReferenceEngine

    m = load_model(name)
    prompts = [p.encode(m.tokenizer) for p in load_prompts("quick").prompts[:n_prompts]]
    plain = ReferenceEngine(m.weights).generate(prompts, N)
    ids = [g.token_ids for g in plain]
    assert len({tuple(t) for t in ids}) > 1 and any(len(set(t)) > 2 for t in ids), "a degenerate stream"
    return m, prompts, plain


def _run(m, prompts, drafter: str, fault: str | None = None, block: int = 4):
    e = SpeculativeEngine(m.weights, drafter=drafter, fault=fault, block=block)
    return e.generate(prompts, N), e.run_stats()["speculation"]


# A fault shows as another token or, where no greedy choice flips, as a top-1 logprob moved far past float32's
# noise: the faithful engine's largest |Δ| against plain decoding was 7.0e-6 (mini-qwen-hybrid, sweep drafts), the
# draft_offset fault's 0.17 there without a flipped token
MOVED = 1e-3


def _same(got, plain) -> bool:
    return all(a.token_ids == b.token_ids for a, b in zip(got, plain))


def _changed(got, plain) -> bool:
    return not _same(got, plain) or max(float(np.max(np.abs(a.top_logprobs[:, 0] - b.top_logprobs[:, 0])))
                                        for a, b in zip(got, plain)) > MOVED


# dense, MoE, Gated DeltaNet hybrid, and K3's mix (MLA + KDA + latent MoE)
@pytest.mark.parametrize("name", ["mini-llama", "mini-gptoss", "mini-qwen-hybrid",
                                  pytest.param("mini-kimi", marks=pytest.mark.heavy)])  # K3: 77 s, its compiles
def test_lossless_for_every_drafter_and_each_fault_changes_the_stream(name):
    m, prompts, plain = _setup(name)
    for drafter in ("oracle", "random", "sweep", "ngram"):
        got, st = _run(m, prompts, drafter)
        assert _same(got, plain) and not _changed(got, plain), (name, drafter)
        if drafter == "oracle":  # every draft accepted (but where the token budget cuts a block short)
            assert st["accepted_drafts_histogram"][-1] >= 0.8 * st["target_steps"], st
        if drafter == "sweep":  # every acceptance length 0..T-1
            assert all(h > 0 for h in st["accepted_drafts_histogram"]), st
    recurrent = name in ("mini-qwen-hybrid", "mini-kimi")
    for fault in set(SpeculativeEngine.faults) - set(KERNEL_FAULTS):  # those the megakernel's own test below
        assert _changed(_run(m, prompts, "sweep", fault)[0], plain), (name, fault)
    if recurrent:  # the state was rebuilt after rejections
        assert _run(m, prompts, "random")[1]["recurrent_rollbacks"] > 0


def test_which_drafts_reach_which_faults():
    """The three draft cases: an oracle draft (acc = T-1 every round) cannot show a fault that needs a rejection,
    a random one (acc about 0) cannot show drafts fed at the wrong positions; the sweep shows both."""
    m, prompts, plain = _setup("mini-llama")
    assert not _changed(_run(m, prompts, "oracle", "accept_extra")[0], plain)
    assert _changed(_run(m, prompts, "oracle", "draft_offset")[0], plain)
    assert _changed(_run(m, prompts, "random", "accept_extra")[0], plain)
    st = _run(m, prompts, "random")[1]
    assert st["acceptance_rate_by_position"][0] < 0.05 and st["acceptance_length"] < 1.05


def test_self_speculative_drafter_and_block_sizes():
    m, prompts, plain = _setup("mini-llama", 4)
    for block in (2, 5):
        got, st = _run(m, prompts, "layers:2", block=block)
        assert _same(got, plain) and st["block"] == block and len(st["acceptance_rate_by_position"]) == block - 1


def test_prompt_lookup():
    assert lookup([5, 6, 7, 1, 5, 6], 3) == [7, 1, 5]  # the 2-gram (5, 6) seen before: what followed it
    assert lookup([1, 2, 3, 9, 2, 3], 2) == [9, 2]
    assert lookup([1, 2, 3], 2) == [3, 3]  # no match: the last token repeated


@pytest.mark.parametrize("extra, said", [({"drafter": "nope"}, "drafter='nope'"), ({"block": "1"}, "block=1"),
                                         ({"block": "x"}, "block='x'"), ({"target": "tpu"}, "target"),
                                         ({"drafter": "layers:9"}, "layers:9"),
                                         ({"interpret": "tpu"}, "target=megakernel"),
                                         ({"target": "megakernel", "interpret": "nope"}, "interpret"),
                                         ({"mla": "absorbed"}, "target=megakernel"),
                                         ({"target": "megakernel", "kv_cache": "fp8"}, "kv_cache")])
def test_bad_options_are_one_line_errors(extra, said):
    m = load_model("mini-llama")
    with pytest.raises(ModelError, match=said):
        SpeculativeEngine.create(m, EngineOptions(extra=extra))


@pytest.mark.parametrize("name", [pytest.param("mini-llama", marks=pytest.mark.heavy),  # the hybrid's path covers it
                                  pytest.param("mini-gptoss", marks=pytest.mark.heavy), "mini-qwen-hybrid"])
def test_the_megakernel_as_target(name):
    """target=megakernel: one kernel call verifies each block (engines.megakernel.verify), a hybrid's state restored
    from the step's snapshots; the stream is plain greedy's with every acceptance length and with rejections, and a
    rollback bug or an off-by-one block mask in the kernel changes it."""
    m, prompts, plain = _setup(name, 4)
    for drafter in ("sweep", "random"):
        e = SpeculativeEngine(m.weights, drafter=drafter, target="megakernel")
        got, st = e.generate(prompts, N), e.run_stats()["speculation"]
        assert _same(got, plain) and not _changed(got, plain), drafter
        assert st["target"] == "megakernel"
        if drafter == "sweep":
            assert all(h > 0 for h in st["accepted_drafts_histogram"]), st
        if drafter == "random" and name == "mini-qwen-hybrid":  # rolled back from snapshots
            assert st["recurrent_rollbacks"] > 0, st
    for fault in ("no_rollback", "block_mask"):
        bad = SpeculativeEngine(m.weights, drafter="sweep", target="megakernel", fault=fault)
        assert _changed(bad.generate(prompts, N), plain), fault


def test_the_megakernel_targets_own_options_reach_it():
    """kv_cache, experts, mla, residual and rounds are the megakernel's options: the speculative engine passes them to
    its target, whose declared bf16 recipe (what diff's judge is built in) says so."""
    m = load_model("mini-kimi-linear")
    e = SpeculativeEngine.create(m, EngineOptions(dtype="bfloat16", extra={
        "target": "megakernel", "mla": "absorbed", "kv_cache": "bfloat16", "residual": "bfloat16", "rounds": "public"}))
    assert e.recipe.mla == "absorbed" and e.recipe.kv_cache == "bfloat16" and e.recipe == e.target.recipe
    assert e.recipe.residual == "bfloat16" and e.recipe.rounds == ("projections", "conv", "out_gate")


@pytest.mark.heavy
def test_the_megakernel_target_with_absorbed_mla_keeps_plain_greedy():
    """The verify step in the absorbed MLA form: the committed stream is the same engine's plain greedy stream."""
    from engines.megakernel import MegakernelEngine

    m = load_model("mini-kimi-linear")
    prompts = [p.encode(m.tokenizer) for p in load_prompts("quick").prompts[:4]]
    plain = MegakernelEngine(m.weights, mla="absorbed").generate(prompts, N)
    e = SpeculativeEngine(m.weights, drafter="sweep", target="megakernel", kernel={"mla": "absorbed"})
    got = e.generate(prompts, N)
    assert _same(got, plain) and not _changed(got, plain)
    assert e.run_stats()["speculation"]["target"] == "megakernel"


def test_a_kernel_fault_needs_the_kernel():
    m = load_model("mini-llama")
    with pytest.raises(ModelError, match="target=megakernel"):
        SpeculativeEngine(m.weights, fault="block_mask")
