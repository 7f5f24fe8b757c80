"""The command line as a user runs it: a real subprocess, one-line errors, non-zero exits."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evalsuite.cli", *args], capture_output=True, text=True,
                          timeout=600, env={**os.environ, **(env or {})})


def assert_one_line_error(p: subprocess.CompletedProcess, *needles: str) -> None:
    assert p.returncode != 0
    assert "Traceback" not in p.stderr
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr
    for n in needles:
        assert n in lines[0], lines[0]


@pytest.mark.slow
def test_generate_paris_json():
    p = run("generate", "--engine", "reference", "--model", "smollm2-135m", "--prompt",
            "The capital of France is", "--max-new-tokens", "8", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["text"].startswith(" Paris.")
    for key in ("model", "engine", "dtype", "prompt_token_ids", "token_ids", "text", "top_logprobs"):
        assert key in out
    assert out["prompt_token_ids"] == [504, 3575, 282, 4649, 314]
    assert len(out["token_ids"]) == 8 and len(out["top_logprobs"]) == 8
    first = out["top_logprobs"][0]
    assert first[0]["id"] == out["token_ids"][0]
    assert [t["logprob"] for t in first] == sorted((t["logprob"] for t in first), reverse=True)


def test_generate_mini_chat_no_stop():
    p = run("generate", "--model", "mini-moe", "--chat", "--prompt", "hi", "--max-new-tokens", "5",
            "--no-stop", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert len(out["token_ids"]) == 5 and out["prompt_token_ids"][0] == 1


def test_unknown_model_suggests():
    assert_one_line_error(run("generate", "--model", "smolm2-135"), "unknown model", "smollm2-135m")


def test_bad_dtype():
    p = run("generate", "--model", "mini-llama", "--dtype", "fp8")
    assert p.returncode == 2 and "Traceback" not in p.stderr and "fp8" in p.stderr


def test_prompt_longer_than_context():
    assert_one_line_error(run("generate", "--model", "mini-llama", "--prompt", "x" * 3000),
                          "exceeds the model's context of 2048")


def test_missing_weight_file(tmp_path):
    assert_one_line_error(run("generate", "--model", str(tmp_path / "nope.gguf")), "weight file not found")


def test_corrupt_weight_file(tmp_path):
    f = tmp_path / "bad.gguf"
    f.write_bytes(b"GGUF" + b"\x00" * 100)
    assert_one_line_error(run("generate", "--model", str(f)), "corrupt GGUF file")


@pytest.mark.slow
def test_sha256_mismatch(tmp_path):
    from evalsuite.models import smollm2_path

    copy = tmp_path / "smollm2.gguf"
    shutil.copy(smollm2_path(), copy)
    with open(copy, "r+b") as f:  # flip one byte deep in the tensor data
        f.seek(50_000_000)
        b = f.read(1)
        f.seek(50_000_000)
        f.write(bytes([b[0] ^ 0xFF]))
    assert_one_line_error(run("generate", env={"EVALSUITE_SMOLLM2_GGUF": str(copy)}), "sha256 mismatch")


def test_unsupported_checkpoint(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    assert_one_line_error(run("generate", "--model", str(tmp_path)), "unsupported architecture 'mamba'")


def test_models_lists_registry():
    p = run("models", "--json")
    assert p.returncode == 0, p.stderr
    rows = {r["name"]: r for r in json.loads(p.stdout)}
    assert set(rows) >= {"smollm2-135m", "mini-llama", "mini-moe", "mini-qwen2", "mini-gemma2", "mini-gemma3",
                         "mini-gptoss"}
    assert rows["smollm2-135m"]["sha256"] == \
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert rows["smollm2-135m"]["params"] == 134_515_008


def test_base_url_without_engine_openai_is_refused():
    p = subprocess.run([sys.executable, "-m", "evalsuite.cli", "run", "gsm8k", "--engine", "megakernel",
                        "--base-url", "http://127.0.0.1:9/v1", "--model", "mini-llama"], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 2
    assert p.stderr.strip() == "error: --base-url applies to a server engine (e.g. openai), not megakernel"


def test_wider_family_minis_generate():
    # every mini generates in-process in test_golden (goldens), and through the megakernel in
    # tests/engines/megakernel/test_kernel.py (its refusals: tests/engines/test_oracle.py); here one through the CLI
    p = run("generate", "--model", "mini-gemma3", "--prompt", "ab", "--max-new-tokens", "4", "--no-stop")
    assert p.returncode == 0, p.stderr


def test_real_models_not_installed_or_unknown_are_one_line_errors(tmp_path):
    p = run("generate", "--model", "qwen2.5-coder-0.5b", env={"EVALSUITE_MODELS_DIR": str(tmp_path)})
    assert_one_line_error(p, "qwen2.5-coder-0.5b is not installed: bash install.sh --models qwen2.5-coder-0.5b")
    p = subprocess.run([sys.executable, "-m", "evalsuite.real_models", "gemma9"], capture_output=True, text=True,
                       timeout=60)
    assert_one_line_error(p, "unknown real model 'gemma9'")
    assert p.returncode == 2


@pytest.mark.parametrize("setting", ["off", "mine"])
def test_one_compile_cache_switch_rules_the_cli(tmp_path, setting):
    """EVALSUITE_COMPILE_CACHE=off writes no cache entry anywhere (home, working folder, jax's own variable's
    folder); EVALSUITE_COMPILE_CACHE=DIR writes there and nowhere else."""
    jax_dir, mine, home, cwd = (tmp_path / d for d in ("jax-var", "mine", "home", "cwd"))
    cwd.mkdir()
    env = {**os.environ, "HOME": str(home), "JAX_COMPILATION_CACHE_DIR": str(jax_dir),
           "EVALSUITE_COMPILE_CACHE": "off" if setting == "off" else str(mine)}
    p = subprocess.run([sys.executable, "-m", "evalsuite.cli", "generate", "--engine", "reference", "--model",
                        "mini-llama", "--max-new-tokens", "2", "--json"], capture_output=True, text=True,
                       timeout=600, env=env, cwd=cwd)
    assert p.returncode == 0, p.stderr[-2000:]
    written = {f.relative_to(tmp_path).parts[0] for f in tmp_path.rglob("*") if f.is_file()}
    assert written == (set() if setting == "off" else {"mine"})


def test_golden_check_takes_engine_options_and_refuses_bad_ones_in_one_line():
    """golden check passes --engine-option to the engine (the megakernel's mla=absorbed: test_mla.py); a key the engine
    lacks, or a value its model cannot take, is one line and exit 2 after the progress line."""
    for option, needle in (("nope=1", "engine megakernel takes one of"),
                           ("mla=absorbed", "mla=absorbed is the form of MLA layers; mini-llama has none"),
                           ("rounds=public", "attention-residual layers and Muse's norms; mini-llama has none"),
                           ("residual=half", "residual='half': expected one of float32, bfloat16")):
        p = run("golden", "check", "--model", "mini-llama", "--engine", "megakernel", "--engine-option", option)
        assert p.returncode == 2 and "Traceback" not in p.stderr
        assert p.stderr.strip().splitlines()[-1].startswith("error: ") and needle in p.stderr, p.stderr
