"""`evalsuite diff` catches every injected bug and passes the faithful engine (slow: real weights)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks.detection import FAMILY_MODELS as FAMILY_MINI
from engines.megakernel import FAULTS
from engines.megakernel.faults import BY_NAME, MODEL_NEEDS
from evalsuite.compare.diff import DiffSpec, run_diff

QUICK = dict(prompts="quick", max_new_tokens=12)
QUICK32 = dict(prompts="quick", max_new_tokens=32)  # 256 positions: enough for the bf16 drift check


# heavy (47 s): CI keeps its siblings, the megakernel's greedy tokens and logprobs equal to the
# reference's on 12 smollm2 prompts (test_smollm2_parity) and diff PASS on mini-llama (test_evidence,
# test_serve)
@pytest.mark.heavy
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_faithful_megakernel_passes(smollm2, dtype):
    r = run_diff(DiffSpec(model="smollm2-135m", dtype=dtype, **(QUICK if dtype == "float32" else QUICK32))).to_json()
    assert r["verdict"] == "PASS", r["per_prompt"]
    assert r["real_mismatches"] == 0
    if dtype == "float32":
        assert r["benign_divergences"] == 0 and r["prompts_identical"] == r["prompts"]
    assert r["batch_invariance"]["deterministic"]
    assert r["batch_invariance"]["batch"] == 4  # batch 1 vs batch 4 reported


# final_norm_eps is below float32 noise on smollm2 (its final hidden states are large): no rule catches it in
# the detection table's 64 prompts (docs/faults.md), so a FAIL here would be news; strict xfail says so if it comes
SUB_NOISE = pytest.mark.xfail(strict=True, reason="sub-noise on smollm2: measured by benchmarks/detection.py")


@pytest.mark.heavy
# every dense fault but batch_variant (only --require batch-invariance sees it: test_batch_invariance)
@pytest.mark.parametrize("fault", [pytest.param(f, marks=SUB_NOISE) if f == "final_norm_eps" else f
                                   for f in FAULTS if BY_NAME[f].needs not in MODEL_NEEDS and f != "batch_variant"])
def test_each_fault_fails_on_smollm2(smollm2, fault):
    r = run_diff(DiffSpec(model="smollm2-135m", fault=fault, **QUICK)).to_json()
    assert r["verdict"] == "FAIL"
    assert r["real_mismatches"] > 0
    named = [p for p in r["per_prompt"] if p["real_positions"]]
    assert named  # the mismatch is named: prompt id and positions
    assert r["real_token_mismatches"] + r["distribution_mismatches"] == r["real_mismatches"]
    print(fault, {k: r[k] for k in ("real_token_mismatches", "distribution_mismatches", "prompts_identical")})
    if fault == "drop_layer":  # bisection names the layer whose MLP the fault skips
        assert r["bisection"]["layer"] == smollm2.config.n_layers // 2


@pytest.mark.heavy
def test_bf16_residual_fails_in_bf16_mode_on_smollm2(smollm2):
    """Regression (issue 10.6): PASSed in bf16 mode (0 real, 7/8 identical). The drift ratio against the
    reference's own bf16 recipe measured 1.59 on this set (bound 1.3; faithful 0.88)."""
    r = run_diff(DiffSpec(model="smollm2-135m", dtype="bfloat16", fault="bf16_residual", **QUICK32)).to_json()
    assert r["verdict"] == "FAIL" and r["bf16_drift"]["checked"] and not r["bf16_drift"]["ok"]


# Every catalogue fault through `diff` on the minis (mini-moe for the MoE faults and norm_eps: mini-llama's epsilon is
# the fault's own 1e-6), in both dtypes; batch_variant under --require batch-invariance (quick set, 12 tokens in
# float32, 32 in bfloat16). norm_eps in float32 PASSes there and stays a strict xfail, so a change that catches it is
# news: it moves the minis' logits below the float32 bound (caught on smollm2 in float32 at prompt 1, docs/faults.md
# detection table, and so in bf16 through the float32 build: test_float32_build). In bf16, measured with the float32
# build (evalsuite/compare/build.py): rope_theta FAILs through the float32 build (its bf16 drift is 1.14: the minis'
# prompts are short), and norm_eps on mini-moe FAILs by a hair on the bf16 drift, ratio 1.31 against the bound 1.3
# (faithful 1.21 at 32 tokens; its float32 build PASSes): a marginal catch. When first measured the drift
# left out routing near-ties and had too few mini-moe positions to run. final_norm_eps in bf16 (drift 1.17) is caught by
# the logit-scale check (rule.SCALE: t -108 on mini-llama builtin). CI keeps bf16_residual (bf16 drift) and
# final_norm_eps (bf16 logit scale); drop_layer's f32 FAIL and bisection run in CI through the CLI
# (test_cli_exit_codes_and_json); stale_feedback FAILs in CI in `run sanity` and `verify`.
MINI_SUB_NOISE = {("float32", "norm_eps")}
# kv_bf16_slot: one extra rounding only the bf16 recipe check sees (drift 0.98 on smollm2's quick set; layer 0 off the
# recipe on 6 of builtin's 6 shortest prompts: benchmarks/results/calibrate-recipe.json)
# (the family faults run heavy here: their catch by diff's rule is in the detection table, benchmarks/detection.py)
IN_CI = {("bfloat16", "bf16_residual"), ("bfloat16", "final_norm_eps"), ("bfloat16", "kv_bf16_slot")}
# a family fault's mini: benchmarks.detection's (engines.megakernel.faults.MODEL_NEEDS); softcap_after_mask is benign
# at Gemma 2's cap of 50 (a masked slot weighs e^-50: test_kernel measures it under the float32 bound), so its diff
# must not FAIL
BENIGN = {"softcap_after_mask"}
BF16_ONLY = {f for f in FAULTS if BY_NAME[f].needs.startswith("bf16")}  # a no-op in float32 (test_kernel)
# the ones that round at every position: the recipe check's majority of prompts sees them (pos_weights_dtype shows
# only past 256 tokens, one prompt of quick's: the per-position bounds FAIL it there, 32 positions on smollm2)
EVERYWHERE = {f for f in BF16_ONLY if BY_NAME[f].needs == "bf16"}


def _catalogue_case(dtype: str, fault: str):
    marks = [] if (dtype, fault) in IN_CI else [pytest.mark.heavy]
    if (dtype, fault) in MINI_SUB_NOISE:
        marks.append(pytest.mark.xfail(strict=True, reason="below the minis' noise: measured PASS (see above)"))
    return pytest.param(dtype, fault, marks=marks)


@pytest.mark.parametrize("dtype, fault", [_catalogue_case(d, f) for d in ("float32", "bfloat16") for f in FAULTS
                                          if (d == "bfloat16" or f not in BF16_ONLY)])
def test_every_fault_fails_in_both_dtypes_on_the_minis(mini_llama, fault, dtype):
    needs = BY_NAME[fault].needs
    model = FAMILY_MINI.get(needs) or ("mini-moe" if needs == "moe" or fault == "norm_eps" else "mini-llama")
    # CI's bf16 cases test the bf16 rules themselves (drift, logit scale, recipe check): without the float32 build,
    # which FAILs the first two as well (test_float32_build covers it), and the batching part (test_batching)
    spec = DiffSpec(model=model, fault=fault, dtype=dtype, **(QUICK if dtype == "float32" else QUICK32),
                    require=("batch-invariance",) if fault == "batch_variant" else (),
                    float32_build=(dtype, fault) not in IN_CI, batching=(dtype, fault) not in IN_CI)
    r = run_diff(spec).to_json()
    if fault in BENIGN:
        assert r["verdict"] != "FAIL" and r["real_mismatches"] == 0, (fault, dtype, r["real_mismatches"])
        return
    assert r["verdict"] == "FAIL", (fault, dtype, r["real_mismatches"], r["bf16_drift"])
    if (fault, dtype) == ("final_norm_eps", "bfloat16"):  # under every per-position bound and the drift bound
        assert r["real_mismatches"] == 0 and r["bf16_drift"]["ok"] and not r["bf16_logit_scale"]["ok"]
    if (fault, dtype) == ("drop_layer", "float32"):  # bisection names the layer whose MLP the fault skips
        assert r["bisection"]["layer"] == mini_llama.config.n_layers // 2, r["bisection"]
    if fault in EVERYWHERE:  # inside bf16's distance from float32: only the recipe check sees it, at layer 0
        assert r["bf16_recipe"]["ok"] is False and r["bf16_recipe"]["first_over"]["layer"] == 0, r["bf16_recipe"]


@pytest.mark.heavy  # 40 s; CI keeps the router bug failing in test_routing (bf16) and test_kernel's bound
def test_router_fault_fails_on_mini_moe():
    r = run_diff(DiffSpec(model="mini-moe", fault="router_second_choice", **QUICK)).to_json()
    assert r["verdict"] == "FAIL" and r["real_mismatches"] > 0


@pytest.mark.heavy
def test_faithful_mini_moe_passes_and_bisection_absent():
    r = run_diff(DiffSpec(model="mini-moe", **QUICK)).to_json()
    assert r["verdict"] == "PASS" and r["bisection"] is None


# The faults of the engine's batching and reporting paths (engines/megakernel/faults.py: knobs of the "loop" and
# "head" parts), through `diff` with its default settings on smollm2 (CI: test_batching drives them on mini-llama,
# and the CLI test below FAILs refill_wrong_row through `diff`)
@pytest.mark.heavy
@pytest.mark.parametrize("fault", ["refill_wrong_row", "shrink_wrong_rows", "prefix_padded", "topk_renormalized",
                                   "topk_ids_swapped"])
def test_loop_and_head_faults_fail_on_smollm2(smollm2, fault):
    r = run_diff(DiffSpec(model="smollm2-135m", fault=fault, **QUICK)).to_json()
    assert r["verdict"] == "FAIL"
    assert r["real_mismatches"] + r["batching"]["real_mismatches"] > 0


@pytest.mark.heavy
@pytest.mark.parametrize("fault", sorted(BF16_ONLY))
def test_one_extra_rounding_fails_bf16_on_smollm2(smollm2, fault):
    r = run_diff(DiffSpec(model="smollm2-135m", fault=fault, dtype="bfloat16", float32_build=False, **QUICK32))
    r = r.to_json()
    assert r["verdict"] == "FAIL"
    if fault in EVERYWHERE:
        assert r["bf16_recipe"]["ok"] is False, r["bf16_recipe"]


def test_cli_exit_codes_and_json(tmp_path, mini_llama):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "evalsuite.cli", "diff", "--model", "mini-llama",
                               "--prompts", "quick", "--max-new-tokens", "8", *args],
                              capture_output=True, text=True, timeout=600)

    ok = run("--json", "--report", str(tmp_path / "rep"))
    assert ok.returncode == 0, ok.stderr
    out = json.loads(ok.stdout)
    for key in ("verdict", "prompts", "real_mismatches", "benign_divergences", "noise_tolerance", "per_prompt"):
        assert key in out
    assert out["verdict"] == "PASS" and out["prompts"] == 12
    from evalsuite.prompts import COVERS  # the set drives what it says it does, every declared path
    assert out["paths"]["not_exercised"] == [] and set(COVERS["quick"]) <= set(out["paths"]["exercised"])
    assert out["batching"]["run"] and out["batching"]["real_mismatches"] == 0 and out["batching"]["prompts"] > 12
    for f in ("report.md", "results.json", "dlogit.png"):
        assert (tmp_path / "rep" / f).stat().st_size > 0
    bad = run("--fault", "drop_layer", "--json", "--no-batching")  # the main part FAILs it (the batching part: below)
    assert bad.returncode == 1, bad.stderr
    r = json.loads(bad.stdout)
    assert r["verdict"] == "FAIL" and r["real_mismatches"] > 0
    assert r["bisection"]["layer"] == mini_llama.config.n_layers // 2  # the layer whose MLP the fault skips
    w = r["conditioning_witness"]  # every flagged prompt witnessed, none cleared: a real bug is not conditioning
    assert w["run"] == w["prompts"] == sum(bool(p["real_positions"]) for p in r["per_prompt"]) > 0
    assert w["positions_cleared"] == 0 and w["not_run"] == 0
    refill = run("--fault", "refill_wrong_row", "--json")  # only the batching part drives a refill of two rows
    assert refill.returncode == 1, refill.stderr
    r = json.loads(refill.stdout)
    assert r["real_mismatches"] == 0 and r["batching"]["real_mismatches"] > 0
    assert r["bisection"]["layer"] is None and r["bisection"]["reproduced"].startswith("not alone")
    usage = run("--batch", "99")
    assert usage.returncode == 2 and "Traceback" not in usage.stderr and "--batch" in usage.stderr


@pytest.mark.heavy
def test_builtin_drives_every_path_of_the_megakernel(smollm2):
    """The default set states what it covers (evalsuite.prompts.COVERS): diff on it drives each of those paths, and
    every path the engine declares (CI: test_cli_exit_codes_and_json does the same for quick on mini-llama)."""
    from evalsuite.prompts import COVERS

    r = run_diff(DiffSpec(model="smollm2-135m", max_new_tokens=4)).to_json()
    assert r["paths"]["not_exercised"] == [], r["paths"]
    assert set(COVERS["builtin"]) <= set(r["paths"]["exercised"])
    assert r["batching"]["synthetic"] == []  # builtin needs none: its own long and prefix-sharing prompts do it
