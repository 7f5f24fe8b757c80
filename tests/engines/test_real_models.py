"""The real models of the wider families against transformers on the same GGUF file (oracle from
benchmarks/hf_gguf_oracle.py). Heavy (nox -s models installs the models and runs these); skipped, saying how to
install, where a model is not installed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engines.errors import ModelError

ORACLES = sorted((Path(__file__).parent / "oracle" / "real").glob("*.json"))
# The float32 bound against transformers (float32, the same dequantised GGUF weights). Measured
# 12 prompts x 32 greedy tokens: each model's max is in docs/models.md, "Real models".
REAL_TOL = 1e-4


def _model(name: str):
    from evalsuite.models import load_model

    try:
        return load_model(name)
    except ModelError as e:
        pytest.skip(str(e))


def compare(model, oracle: dict) -> dict:
    """Greedy tokens and top-5 logprobs of the float32 reference against the oracle. A run is compared up to
    its first near-tie (oracle top-1/top-2 gap within REAL_TOL), where either token is a valid greedy choice."""
    from engines.reference import ReferenceEngine

    runs = oracle["runs"]
    gens = ReferenceEngine(model.weights).generate([r["prompt"] for r in runs], oracle["n_new"], top_k=5,
                                                   stop_ids=())
    worst, compared, tie_cut = 0.0, 0, 0
    for r, g in zip(runs, gens):
        for i, s in enumerate(r["steps"]):
            assert list(g.top_ids[i]) == s["top_ids"] or s["gap"] <= REAL_TOL or \
                list(g.top_ids[i][:1]) == s["top_ids"][:1], (oracle["name"], r["text"][:30], i)
            same = {t: v for t, v in zip(s["top_ids"], s["top_logprobs"])}
            for t, v in zip(g.top_ids[i], g.top_logprobs[i]):
                if t in same:
                    worst = max(worst, abs(float(v) - same[t]))
            compared += 1
            if g.token_ids[i] != r["tokens"][i]:
                assert s["gap"] <= REAL_TOL, (oracle["name"], r["text"][:30], i, s["gap"])
                tie_cut += 1
                break
    return {"max_dlogprob": worst, "positions": compared, "runs_cut_at_a_tie": tie_cut}


@pytest.mark.heavy
@pytest.mark.parametrize("path", ORACLES, ids=[p.stem for p in ORACLES])
def test_real_model_matches_transformers_on_the_same_gguf(path):
    oracle = json.loads(path.read_text())
    model = _model(oracle["name"])
    window = model.config.sliding_window
    assert not window or max(len(r["prompt"]) for r in oracle["runs"]) > window + 100  # the window is crossed
    r = compare(model, oracle)
    print(oracle["name"], r)
    assert r["positions"] >= 0.9 * len(oracle["runs"]) * oracle["n_new"]
    assert r["max_dlogprob"] <= REAL_TOL, r


@pytest.mark.heavy
@pytest.mark.parametrize("path", ORACLES, ids=[p.stem for p in ORACLES])
def test_gguf_tokenizer_matches_transformers(path):
    oracle = json.loads(path.read_text())
    model = _model(oracle["name"])
    assert model.tokenizer is not None
    for r in oracle["runs"]:
        assert model.tokenizer.encode(r["text"]) == r["prompt"], r["text"]
    assert len(oracle["tokenizer_checks"]) >= 10
    for text, ids in oracle["tokenizer_checks"]:  # whitespace runs, unicode, control tokens in the text
        assert model.tokenizer.encode(text) == ids, text
