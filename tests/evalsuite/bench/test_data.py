"""Data sources: bundled, a folder, the hub (`--data hub`): each named in the result, and the hub's failure
modes (gated without a token, offline, unreachable) are one line saying what to do. No network is used:
the hub download itself cannot run here, so the cache it fills is pre-written for the end-to-end check."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

from evalsuite.bench import data
from evalsuite.errors import SpecError


def test_gated_gpqa_without_a_token_is_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"} | {"EVALSUITE_DATA_CACHE": str(tmp_path)}
    p = subprocess.run([sys.executable, "-m", "evalsuite.cli", "run", "gpqa", "--data", "hub", "--model", "mini-llama",
                        "--output", str(tmp_path / "o")], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip().count("\n") == 0 and "gated" in p.stderr and "HF_TOKEN" in p.stderr


@pytest.mark.parametrize("case", ["offline", "unreachable", "no-source"])
def test_hub_failures_say_what_to_do(monkeypatch, tmp_path, case):
    monkeypatch.setenv("EVALSUITE_DATA_CACHE", str(tmp_path))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    if case == "offline":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    if case == "unreachable":
        monkeypatch.setattr(data, "HUB_HOST", "hub.invalid")  # .invalid never resolves (RFC 2606)
    with pytest.raises(SpecError) as e:
        data.resolve("sanity" if case == "no-source" else "gsm8k", "hub")
    msg = str(e.value)
    assert "\n" not in msg and {"offline": "--data DIR", "unreachable": "cannot reach hub.invalid",
                                "no-source": "no hub source"}[case] in msg


def test_hub_cache_is_used_and_named(monkeypatch, tmp_path):
    rows = [{"question": f"What is {i} + 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"} for i in range(3)]
    cached = tmp_path / "gsm8k-main-test.jsonl"
    cached.write_text("".join(json.dumps(r) + "\n" for r in rows))
    train = tmp_path / "gsm8k-main-train.jsonl"  # the split lm-eval draws the 5 exemplars from
    train.write_text("".join(json.dumps(r) + "\n" for r in rows[::-1]))
    monkeypatch.setenv("EVALSUITE_DATA_CACHE", str(tmp_path))
    d = data.resolve("gsm8k", "hub")
    assert (d.path, d.source, d.origin, d.bundled) == (cached, "hub", "openai/gsm8k/main/test", False)
    assert d.fewshot == train
    assert len(data.load_rows(d.path)) == 3
    sha = hashlib.sha256
    assert sha(cached.read_bytes()).hexdigest() != sha(data.BUNDLED["gsm8k"].read_bytes()).hexdigest()
    assert data.resolve("gsm8k", None).source == data.resolve("gsm8k", "bundled").source == "bundled"
