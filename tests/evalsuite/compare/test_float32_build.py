"""A bf16 `diff` also diffs the engine built in float32 (evalsuite/compare/build.py): its FAIL is the run's FAIL,
its INCONCLUSIVE or absence is said and blocks nothing (the bf16 verdict never rested on it)."""

from __future__ import annotations

import json

import pytest

from engines.errors import ModelError
from evalsuite.compare.build import with_float32_build
from evalsuite.compare.diff import DiffSpec, run_diff
from evalsuite.prompts import load_prompts
from evalsuite.results import DiffResult


def _bf16(verdict="PASS") -> DiffResult:
    return DiffResult(verdict=verdict, dtype="bfloat16", prompts=2, positions=8, seconds=1.0)


def _f32(verdict, failing=()) -> DiffResult:
    return DiffResult(verdict=verdict, dtype="float32", prompts=2, positions=8, real_mismatches=len(failing),
                      not_checked=("something",) if verdict == "INCONCLUSIVE" else (),
                      failing_prompts=tuple(failing), deterministic=True, seconds=1.0)


def test_the_float32_builds_verdict_is_folded_in_without_removing_any_check():
    spec = DiffSpec(model="mini-llama", dtype="bfloat16")
    seen = []

    def one(s):
        seen.append(s)
        return _f32("FAIL", failing=("a",))

    r = with_float32_build(spec, _bf16("PASS"), one)
    assert r.verdict == "FAIL" and r.details["float32_build"]["failing_prompts"] == ["a"]
    # run as float32 with float32's own bounds; a bf16 --noise-tol does not carry over, nor does it recurse
    assert seen[0].dtype == "float32" and seen[0].noise_tol is None and not seen[0].float32_build
    # an INCONCLUSIVE float32 build is said; a bf16 PASS (reached on its own evidence) stays
    r = with_float32_build(spec, _bf16("PASS"), lambda s: _f32("INCONCLUSIVE"))
    assert r.verdict == "PASS" and any("INCONCLUSIVE (something)" in n for n in r.checks_not_possible)
    # it never lifts a verdict: a bf16 FAIL or INCONCLUSIVE stays with a float32 PASS
    for v in ("FAIL", "INCONCLUSIVE"):
        assert with_float32_build(spec, _bf16(v), lambda s: _f32("PASS")).verdict == v

    def unbuildable(s):
        raise ModelError("the numpy engine runs dense models in float32 only")

    def crashes(s):  # a plugin that breaks the protocol (ModelError) in its float32 path
        raise IndexError("list index out of range\n  more lines")

    for s, one_, said in ((spec, unbuildable, "could not be built: the numpy engine"),
                          (spec, crashes, "it raised IndexError: list index out of range"),
                          (DiffSpec(dtype="bfloat16", float32_build=False), None, "--no-float32-build"),
                          (DiffSpec(dtype="bfloat16", engine="openai"), None, "served engine"),
                          (DiffSpec(dtype="bfloat16", engine="reference"), None, "the judge itself")):
        r = with_float32_build(s, _bf16("PASS"), one_)
        assert r.verdict == "PASS" and not r.details["float32_build"]["run"]
        assert any(said in n for n in r.checks_not_possible), r.checks_not_possible


@pytest.fixture
def three(tmp_path):
    rows = load_prompts("quick").prompts[:3]
    f = tmp_path / "three.jsonl"
    f.write_text("".join(json.dumps({"id": p.id, "kind": p.kind, "text": p.text}) + "\n" for p in rows))
    return str(f)


def test_a_bf16_diff_runs_the_float32_build_on_the_same_prompts(three):
    """mini-llama, real engines: with a kernel bug (kv_stale) the float32 build, run on the same prompts, FAILs and
    names them. (The faithful build's PASS beside a bf16 run: test_routing, on mini-moe, in CI.)"""
    bad = run_diff(DiffSpec(model="mini-llama", dtype="bfloat16", prompts=three, max_new_tokens=6,
                            fault="kv_stale", batching=False)).to_json()  # the main parts FAIL it
    b = bad["float32_build"]
    assert bad["verdict"] == "FAIL" and b["run"] and b["verdict"] == "FAIL" and b["failing_prompts"]
    assert b["prompts"] == bad["prompts"] == 3 and b["positions"] == 18
    # kv_stale's flagged bf16 positions are judged again with the reference's own bf16 recipe's error there (and,
    # where flags remain, its other reduction orders: the permuted weights), and the bug still FAILs
    from evalsuite.compare.witness import ORDER_PROMPTS

    w = bad["conditioning_witness"]
    assert bad["real_mismatches"] > 0 and w["run"] == w["prompts"] > 0 and "bf16 recipe" in w["measured"]
    assert w["positions_cleared"] < w["positions_flagged"] and 0 < w["prompts_with_other_orders"] <= ORDER_PROMPTS


@pytest.mark.heavy
def test_norm_eps_below_bf16_rounding_fails_through_the_float32_build(smollm2):
    """RMSNorm epsilon 1e-6 for 1e-5: in bf16 no rule sees it on smollm2 (detection table); its float32 build
    FAILs. Before build.py, `diff --dtype bfloat16 --fault norm_eps` on smollm2 could not FAIL."""
    r = run_diff(DiffSpec(model="smollm2-135m", dtype="bfloat16", fault="norm_eps", prompts="quick",
                          max_new_tokens=32)).to_json()
    assert r["real_mismatches"] == 0  # the bf16 run's own evidence: nothing
    assert r["verdict"] == "FAIL" and r["float32_build"]["verdict"] == "FAIL"
    assert r["float32_build"]["real_mismatches"] > 0
