"""The benchmark scripts' input checks (their figures are measured by hand and committed as JSON: docs/)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from benchmarks.judge_peak import token_flops
from evalsuite.models import load_model


def _run(*args):
    return subprocess.run([sys.executable, "-m", "benchmarks.judge_peak", *args], capture_output=True, text=True,
                          timeout=300)


def test_judge_peak_refuses_what_it_cannot_count_in_one_line():
    p = _run("--model", "mini-moe")  # its FLOP count is a dense decoder's
    assert p.returncode != 0 and p.stderr.strip().count("\n") == 0 and "dense" in p.stderr, p.stderr
    p = _run("--results", "/nonexistent/dir/x.json")  # before minutes of timing, not after
    assert p.returncode != 0 and "no directory" in p.stderr and "Traceback" not in p.stderr


def test_judge_peak_counts_a_token_by_hand():
    """mini-llama at position 9: every projection's multiply-adds, attention over 10 keys a layer, and the head."""
    c = load_model("mini-llama").config
    D, H, K, hd, F, L, V = c.hidden, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn, c.n_layers, c.vocab_size
    per_layer = 2 * D * H * hd + 2 * 2 * D * K * hd + 2 * H * hd * D + 3 * 2 * D * F + 2 * 2 * H * hd * 10
    assert token_flops(c, 9, True) == L * per_layer + 2 * D * V
    assert token_flops(c, 9, False) == L * per_layer


def test_judge_profile_counts_nested_operations_once():
    """A conditional's or a loop's event contains its body's: each counts only its own time (on its own thread)."""
    from benchmarks.judge_profile import self_seconds

    ev = [{"thread": t, "ts": ts, "dur": d} for t, ts, d in (("a", 0, 100), ("a", 10, 30), ("a", 50, 10), ("a", 55, 2),
                                                              ("b", 20, 40), ("a", 200, 5))]
    assert [round(x * 1e6) for x in self_seconds(ev)] == [60, 30, 8, 2, 40, 5]


def test_judge_profile_needs_xla_events_and_groups_by_operation_name():
    """Without XLA's TraceMe events there is nothing to group: one line and a non-zero exit, before any model loads.
    The groups: YNNPACK's fusions are the matmuls, XLA's dots the attention's, top-k a custom call."""
    from benchmarks.judge_profile import group_of

    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    p = subprocess.run([sys.executable, "-m", "benchmarks.judge_profile"], capture_output=True, text=True, timeout=120,
                       env=env)
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert p.stderr.strip() == "error: set XLA_FLAGS=--xla_cpu_enable_xprof_traceme=true (XLA's per-operation events)"
    assert group_of("ynn_fusion") == group_of("ynn_fusion.12") == "matmuls (YNNPACK fusions)"
    assert group_of("dot.236").startswith("dots (XLA's own") and group_of("custom-call") == "top-k and argmax"
    assert group_of("dynamic-slice_bitcast_fusion.3").startswith("dynamic-slice copies")
    assert group_of("bitcast_copy_fusion.3").startswith("other")


BAD_INPUT = [
    ("benchmarks.drift_parts", ["--model", "nope"], "unknown model"),
    ("benchmarks.drift_parts", ["--model", "mini-llama", "--prompts", "12"], "multiple of 8"),
    ("benchmarks.drift_parts", ["--model", "mini-llama", "--faults", "no_such_fault"], "unknown fault"),
    ("benchmarks.drift_parts", ["--model", "mini-llama", "--out", "/nonexistent/x.json"], "no directory"),
    ("benchmarks.f32_oracle_witness", ["--models", "nope"], "no committed oracle for nope"),
    ("benchmarks.f32_oracle_witness", ["--out", "/nonexistent/x.json"], "no directory"),
    ("benchmarks.order_spread", ["--model", "nope"], "--model nope"),
    ("benchmarks.order_spread", ["--prompts", "0"], "at least 1"),
    ("benchmarks.order_spread", ["--out", "/nonexistent/x.json"], "no directory"),
    ("benchmarks.recipe_taps", ["--positions", "x"], "comma-separated integers"),
    ("benchmarks.recipe_taps", ["--prompt", "nope"], "no prompt 'nope'"),
    ("benchmarks.recipe_taps", ["--out", "/nonexistent/x.json"], "no directory"),
    ("interop.tpu_ops", [], "not a TPU"),  # CI has no TPU: the one-line refusal
    ("interop.tpu_ops", ["--interpret", "--out", "/nonexistent/x.json"], "no directory"),
]


@pytest.mark.parametrize("module, args, why", BAD_INPUT, ids=[f"{m.split('.')[1]}-{i}" for i, (m, _, _) in
                                                              enumerate(BAD_INPUT)])
def test_benchmark_scripts_refuse_bad_input_in_one_line(module, args, why):
    p = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and p.stderr.strip().count("\n") == 0 and why in p.stderr, (args, p.stderr)


def test_seed_minis_passes_engine_options_and_keeps_rows_of_the_same_settings_only(tmp_path, monkeypatch):
    """--engine-option reaches every run's argv; --resume keeps a finished row only when its argv (the options
    included) is this invocation's, so rows of another recipe are run again, not mixed in."""
    import json

    from benchmarks import seed_minis

    args = seed_minis.argv("diff", "mini-qwen-hybrid", "bfloat16", "generic", ("rounds=public", "residual=bfloat16"))
    i = args.index("rounds=public")
    assert args[i - 1] == "--engine-option" and args[i + 1:i + 3] == ["--engine-option", "residual=bfloat16"]
    key = ("golden", "mini-qwen-hybrid", "bfloat16", "generic")
    row = dict(zip(("command", "model", "dtype", "interpret"), key)) | {"verdict": "PASS", "seconds": 1.0,
                                                                         "argv": seed_minis.argv(*key)}
    out = tmp_path / "m.json"
    out.write_text(json.dumps({"rows": [row]}))
    ran = []
    monkeypatch.setattr(seed_minis, "run_one", lambda k, extra=(): ran.append((k, extra)) or {
        **row, "argv": seed_minis.argv(*k, extra)})
    common = ["--out", str(out), "--resume", "--models", "mini-qwen-hybrid", "--dtypes", "bfloat16", "--modes",
              "generic", "--commands", "golden"]
    assert seed_minis.main(common) == 0 and ran == []  # the same settings: kept
    assert seed_minis.main([*common, "--engine-option", "rounds=public"]) == 0
    assert ran == [(key, ("rounds=public",))]
    assert json.loads(out.read_text())["engine_options"] == ["rounds=public"]
