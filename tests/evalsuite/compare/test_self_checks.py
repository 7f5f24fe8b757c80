"""The engine's checks on itself as a verdict condition (Engine.self_checks): the megakernel in TPU interpret mode
reports its race detector, and diff FAILs on a race. Each path: PASS-able (a clean run), FAIL (the single-buffered
negative control, whose next layer's weights are copied over the ones being read), INCONCLUSIVE (a clean run whose
batching part was turned off)."""

from __future__ import annotations

import json

import pytest
from jax.experimental.pallas import tpu as pltpu

from engines.megakernel import MegakernelEngine
from evalsuite.compare.diff import DiffSpec, run_diff

RACE = "race detector (TPU interpret mode)"


@pytest.fixture()
def two_prompts(tmp_path):
    path = tmp_path / "two.jsonl"
    path.write_text("\n".join(json.dumps({"id": f"p{i}", "token_ids": ids})
                              for i, ids in enumerate([[5, 17, 42, 9, 88, 3], list(range(20, 52))])) + "\n")
    return str(path)


def _diff(prompts: str, n_buffers: int, monkeypatch, batching: bool = False):
    if n_buffers != 2:  # the negative control is not an engine option: built so for this test only
        real = MegakernelEngine.__init__
        monkeypatch.setattr(MegakernelEngine, "__init__", lambda self, *a, **k: real(self, *a, **k, n_buffers=1))
    pltpu.reset_tpu_interpret_mode_state()
    return run_diff(DiffSpec(engine="megakernel", model="mini-llama", prompts=prompts, max_new_tokens=3,
                             batching=batching, engine_options=(("interpret", "tpu"),)))


def test_a_race_fails_the_diff_and_a_clean_run_reports_its_check(two_prompts, monkeypatch):
    bad = _diff(two_prompts, 1, monkeypatch)
    checks = bad.details["engine_self_checks"]
    assert bad.verdict == "FAIL" and [c["name"] for c in checks] == [RACE] and not checks[0]["ok"]
    monkeypatch.undo()
    good = _diff(two_prompts, 2, monkeypatch)
    assert [(c["name"], c["ok"]) for c in good.details["engine_self_checks"]] == [(RACE, True)]
    assert good.verdict == "INCONCLUSIVE" and good.real_mismatches == 0  # the batching part was off; nothing failed
    assert any("batching part" in n for n in good.not_checked)


def test_a_failed_self_check_alone_fails_the_diff(two_prompts, monkeypatch):
    """The generic interpreter's numbers are right (0 real mismatches); a self-check that is not ok FAILs anyway."""
    failed = [{"name": "a sanitizer", "ok": False, "detail": "injected by the test"}]
    monkeypatch.setattr(MegakernelEngine, "self_checks", lambda self: failed)
    r = run_diff(DiffSpec(engine="megakernel", model="mini-llama", prompts=two_prompts, max_new_tokens=3,
                          batching=False))
    assert r.verdict == "FAIL" and r.real_mismatches == 0 and r.details["engine_self_checks"] == failed


def test_the_generic_interpreter_runs_no_self_check(mini_llama):
    assert MegakernelEngine(mini_llama.weights).self_checks() == []


@pytest.mark.heavy
def test_a_clean_tpu_interpret_run_passes():
    """The quick set in TPU interpret mode, race detector on: PASS with the check ok."""
    pltpu.reset_tpu_interpret_mode_state()
    r = run_diff(DiffSpec(engine="megakernel", model="mini-llama", prompts="quick", max_new_tokens=8,
                          engine_options=(("interpret", "tpu"),)))
    assert r.verdict == "PASS" and [(c["name"], c["ok"]) for c in r.details["engine_self_checks"]] == [(RACE, True)]


def test_golden_check_fails_on_a_failed_self_check(monkeypatch):
    from evalsuite import golden

    failed = [{"name": "a sanitizer", "ok": False, "detail": "injected by the test"}]
    monkeypatch.setattr(MegakernelEngine, "self_checks", lambda self: failed)
    r = golden.check("mini-llama", "megakernel")
    assert r.verdict == "FAIL" and r.summary["mismatching_positions"] == 0
    assert r.problems == ("engine self-check failed: a sanitizer (injected by the test)",)
