"""`evalsuite diff --engine spec` reaches all three verdicts: PASS where the drafts drove every branch of the accept
rule (the sweep drafter), FAIL on a speculation bug, INCONCLUSIVE where the drafts never reached a branch (random
drafts are never all accepted, so the accept-all path and its bonus row went unchecked)."""

from __future__ import annotations

import pytest

from evalsuite.compare.diff import DiffSpec, run_diff


def _diff(drafter: str, fault: str | None = None, batching: bool = True):
    return run_diff(DiffSpec(engine="spec", model="mini-llama", prompts="quick", max_new_tokens=16, fault=fault,
                             batching=batching, engine_options=(("drafter", drafter),)))


def test_pass_with_every_branch_driven():
    r = _diff("sweep")
    sp = r.details["engine_stats"]["speculation"]
    assert r.verdict == "PASS", (r.not_checked, r.failing_prompts)
    assert r.details["paths"]["not_exercised"] == [] and sp["target_steps"] > 0
    assert all(h > 0 for h in sp["accepted_drafts_histogram"]) and 1 < sp["acceptance_length"] < sp["block"]


def test_fail_on_a_speculation_bug():
    r = _diff("sweep", fault="bonus_row", batching=False)
    assert r.verdict == "FAIL" and r.real_mismatches > 0 and r.failing_prompts


def test_inconclusive_where_the_drafts_reach_no_accept_all():
    r = _diff("random")
    assert r.verdict == "INCONCLUSIVE" and r.real_mismatches == 0
    assert "spec_accept_all" in r.details["paths"]["not_exercised"]
    assert any("spec_accept_all" in n for n in r.not_checked)


def test_bf16_flips_at_near_ties_are_benign():
    """bf16: the engine's tokens flip against the float32 judge at some near-ties; the comparator's bf16 margin
    calls them benign and the verdict can PASS (the recipe check reads the verify step's own taps)."""
    ok = run_diff(DiffSpec(engine="spec", model="mini-llama", prompts="quick", dtype="bfloat16",
                           engine_options=(("drafter", "sweep"),)))
    assert ok.verdict == "PASS" and ok.real_mismatches == 0, (ok.not_checked, ok.failing_prompts)
    assert ok.details["bf16_recipe"]["checked"] and ok.details["float32_build"]["verdict"] == "PASS"


@pytest.mark.heavy  # CI: test_float32_build fails a bug bf16 hides through the same float32 build
def test_bf16_rollback_bug_is_failed_by_the_float32_build():
    """A rollback bug whose bf16 divergences all look benign is failed by the engine's float32 build on the same
    prompts (82 real mismatches on mini-llama `quick`)."""
    bad = run_diff(DiffSpec(engine="spec", model="mini-llama", prompts="quick", dtype="bfloat16", batching=False,
                            fault="no_rollback", engine_options=(("drafter", "sweep"),)))
    assert bad.verdict == "FAIL" and bad.details["float32_build"]["verdict"] == "FAIL"
