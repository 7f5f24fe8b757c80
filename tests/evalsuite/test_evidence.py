"""Issue 10: no PASS without evidence. Unit tests of the one comparison rule (synthetic logits, so
each case is exact), fingerprints, and reports on API-shaped results; end-to-end verdict paths of
`verify` on mini-llama."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engines.base import Forced, Generation
from evalsuite.compare import rule

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
V, N = 50, 4


def _ref(seed=0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 3, (N, V))
    return logits, logits.argmax(-1)


def _cmp(ref, toks, gen_toks, gen_lp, forced, tol):
    """The one comparator, fed as diff feeds it: the reference's track from its logits, the engine's
    free-running tokens with their logprobs, and its teacher-forced record."""
    ids = np.asarray([int(t) for t in gen_toks], np.int64)[:, None]  # greedy: rank 1 is the token generated
    g = Generation([], [int(t) for t in gen_toks], ids, np.asarray(gen_lp), "length")
    return rule.compare_prompt(toks, Forced.from_logits(ref, toks, 5), forced, g, tol)


def _gen_lp(logits, toks):
    lp = rule.metrics.log_softmax(logits)
    return lp[np.arange(len(toks)), toks][:, None]


def test_near_tie_rule_looks_at_the_engine_token():
    """Regression (10.5): a flip to the reference's LAST-ranked token at a gap-0.5 position was benign."""
    ref, toks = _ref()
    ref[1] = np.linspace(10, -30, V)  # top-1 at id 0, gap 0.5 to id 1 below
    ref[1, 1] = 9.5
    toks = ref.argmax(-1)
    eng = ref.copy()
    eng[1, V - 1] = 20.0  # the engine picks the token the reference ranks last
    tol = rule.Tolerances.for_dtype("bfloat16")
    rec = _cmp(ref, toks, toks, _gen_lp(ref, toks), Forced.from_logits(eng, toks, 5), tol)
    assert 1 in rec["token_mismatches"] and 1 not in rec["benign_positions"]
    # a near-tie (gap 0.01) where the engine picks the runner-up and moves nothing else: benign
    ref[1, 1] = 9.99
    toks = ref.argmax(-1)
    eng2 = ref.copy()
    eng2[1, 1], eng2[1, 0] = 9.995, 9.994
    rec = _cmp(ref, toks, toks, _gen_lp(ref, toks), Forced.from_logits(eng2, toks, 5), tol)
    assert rec["benign_positions"] == [1] and rec["real_positions"] == []


def test_float32_logit_shift_without_a_flip_is_real():
    """Regression (10.6): a kernel bug moving logits by 0.045 (370x f32 noise) with no token flip PASSed."""
    ref, toks = _ref(1)
    eng = ref.copy()
    eng[2, 7] += 0.045 if ref[2, 7] < ref[2].max() - 1 else -0.045
    rec = _cmp(ref, toks, toks, _gen_lp(ref, toks), Forced.from_logits(eng, toks, 5),
                              rule.Tolerances.for_dtype("float32"))
    assert rec["distribution_mismatches"] == [2] and rec["token_mismatches"] == []
    ok = _cmp(ref, toks, toks, _gen_lp(ref, toks), Forced.from_logits(ref + 1e-5, toks, 5),
                             rule.Tolerances.for_dtype("float32"))
    assert ok["real_positions"] == []


def test_free_running_divergence_is_judged_for_full_logit_engines():
    """Regression (10.4): teacher-forced logits right, generated tokens wrong from position 2: PASSed."""
    ref, toks = _ref(2)
    bad = toks.copy()
    bad[2] = int(ref[2].argmin())  # far from the top-1
    rec = _cmp(ref, toks, bad, _gen_lp(ref, bad), Forced.from_logits(ref.copy(), toks, 5),
                              rule.Tolerances.for_dtype("float32"))
    assert rec["first_divergence"]["position"] == 2 and rec["first_divergence"]["class"] == "real"
    assert 2 in rec["real_positions"]


def test_api_shaped_results_make_a_report(tmp_path):
    """Regression (10.8): report.py raised KeyError 'dlogit' on an API result with a divergence."""
    from evalsuite.report import diff_report

    ref, toks = _ref(3)
    bad = toks.copy()
    bad[1] = int(ref[1].argmin())
    lp = rule.metrics.log_softmax(ref)
    ids = np.argsort(-ref, -1)[:, :5]
    forced = Forced(lp[np.arange(N), toks], ids, np.take_along_axis(lp, ids, -1))
    rec = _cmp(ref, toks, bad, _gen_lp(ref, bad), forced, rule.Tolerances.for_dtype("float32"))
    result = {"verdict": "FAIL", "engine": "openai", "against": "reference", "model": "m", "dtype": "float32",
              "fault": None, "prompts": 1, "prompt_set": "x", "prompt_set_sha256": "0" * 64, "max_new_tokens": N,
              "positions": N, "weights_sha256": "0" * 64, "real_mismatches": len(rec["real_positions"]),
              "benign_divergences": 0, "prompts_identical": 0, "real_token_mismatches": 1,
              "distribution_mismatches": 0, "tolerances": {}, "noise_tolerance": 1e-3, "noise_tolerance_rule": "r",
              "observed_noise": {"n": 0}, "summary": {"argmax_agreement": 1.0}, "logprob_tolerance": 1e-3,
              "checks_not_possible": ["full-vocabulary logits"], "batch_invariance": {
                  "batch": 1, "invariant": True, "deterministic": True}, "bisection": None,
              "bf16_drift": {"checked": False, "why": "float32"},
              "per_prompt": [{"id": "p", "kind": "raw", "prompt_tokens": 3, **rec}]}
    files = diff_report(result, tmp_path)
    assert all(f.stat().st_size > 0 for f in files)
    assert "not checked: full-vocabulary logits" in (tmp_path / "report.md").read_text()


def test_noise_tolerance_override_is_recorded():
    t = rule.Tolerances.for_dtype("float32", 0.5)
    assert t.overrides() == {"noise_tol": {"used": 0.5, "default": rule.NOISE_TOL["float32"]}}
    assert rule.Tolerances.for_dtype("float32").overrides() == {}


def test_in_process_fingerprint_changes_with_one_source_line(tmp_path):
    """Regression (10.2): journal keys ignored what the engine is; now they hold its fingerprint."""
    from engines.base import source_fingerprint

    pkg = tmp_path / "kernel_pkg"
    shutil.copytree(Path(__file__).parents[2] / "engines" / "megakernel", pkg)
    before = source_fingerprint(pkg, {"dtype": "float32"})
    assert source_fingerprint(pkg, {"dtype": "float32"}) == before
    k = pkg / "kernel.py"
    k.write_text(k.read_text().replace("F32 = jnp.float32", "F32 = jnp.float32  # one line changed"))
    assert source_fingerprint(pkg, {"dtype": "float32"}) != before
    assert source_fingerprint(pkg, {"dtype": "bfloat16"}) != source_fingerprint(pkg, {"dtype": "float32"})


def test_changed_engine_never_reuses_journal_answers(mini_llama, monkeypatch, tmp_path):
    from engines.megakernel import MegakernelEngine
    from evalsuite.bench.adapter import EngineLM

    journal = tmp_path / "j.jsonl"
    lm = EngineLM(engine="megakernel", model="mini-llama", journal=str(journal), progress=False)
    lm._loglikelihood_tokens([(None, [1, 2, 3], [4])])
    lm.journal.close()
    calls = []
    monkeypatch.setattr(MegakernelEngine, "fingerprint", property(lambda self: "another-kernel"))
    lm2 = EngineLM(engine="megakernel", model="mini-llama", journal=str(journal), progress=False)
    orig = lm2._score
    monkeypatch.setattr(lm2, "_score", lambda *a: calls.append(a) or orig(*a))
    lm2._loglikelihood_tokens([(None, [1, 2, 3], [4])])
    lm2.journal.close()
    assert len(calls) == 1  # recomputed, not reused


def _cli(*args, timeout=1200):
    return subprocess.run([sys.executable, "-m", "evalsuite.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **OFFLINE})


@pytest.mark.parametrize("extra, code, verdict", [
    ((), 0, "PASS"),                                  # sanity's 240 items reach PASS, the rest too
    # diff and sanity both FAIL on it (the golden check is teacher-forced: stale_feedback passes it)
    (("--fault", "stale_feedback", "--limit", "24", "--parts", "diff,sanity"), 1, "FAIL"),
    (("--limit", "12", "--parts", "sanity"), 3, "INCONCLUSIVE"),  # 12 items cannot show non-inferiority
])
def test_verify_reaches_every_verdict(tmp_path, extra, code, verdict):
    p = _cli("verify", "--model", "mini-llama", "--tasks", "sanity", "--prompts", "quick",
             "--output", str(tmp_path / "v"), "--json", *extra)
    assert p.returncode == code, p.stderr[-3000:]
    r = json.loads(p.stdout)
    assert r["verdict"] == verdict
    report = (tmp_path / "v" / "report.md").read_text()
    assert f"**{verdict}**" in report
    if verdict == "INCONCLUSIVE":
        assert "PASS needs n >= 183" in report and "To settle it" in report
    if verdict == "FAIL":
        assert r["warnings"] and "responses differ" in " ".join(r["warnings"]) and "Warnings" in report
