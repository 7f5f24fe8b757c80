"""The openai client engine against a real, misbehaving HTTP server on loopback (fake_server)."""

from __future__ import annotations

import time

import pytest

from engines.errors import ModelError
from engines.openai.client import BACKOFF_S, MAX_ATTEMPTS, OpenAIEngine, Remote
from tests.engines.openai.fake_server import Fake

SECRET = "sk-test-do-not-print-0123456789"


def _engine(fake: Fake, mini_llama, **kw) -> OpenAIEngine:
    return OpenAIEngine(Remote(fake.url, **kw), mini_llama.config, mini_llama.tokenizer)


def test_probe_declares_capabilities(mini_llama):
    with Fake("ok") as f:
        e = _engine(f, mini_llama)
        assert {"generate", "token_ids", "gen_logprobs", "echo_logprobs", "tokenize"} <= e.usable
        assert e.model_id == "fake-model" and e.config.max_context == min(mini_llama.config.max_context, 4096)
        g = e.generate([[10, 11]], 3, top_k=1)[0]
        assert g.token_ids == [5, 6, 7] and g.top_logprobs[:, 0].tolist() == [-0.5] * 3
        f = e.forced_topk([[10, 11]], [[12, 13]], 1)[0]
        lp, ids = f.token_logprobs, f.top_ids
        assert lp.tolist() == [-0.5, -0.5] and ids[:, 0].tolist() == [12, 13]


def test_bare_server_says_what_is_impossible(mini_llama):
    with Fake("minimal") as f:
        e = _engine(f, mini_llama)
        assert e.usable == {"generate"}  # it ignores stop strings: the probe finds out
        assert any("re-tokenized" in n for n in e.notes) and any("loglikelihood" in n for n in e.notes)
        g = e.generate([[10, 11]], 3, top_k=1)[0]
        assert g.token_ids == mini_llama.tokenizer.encode("abc")  # from the text, said in notes
        with pytest.raises(ModelError, match="no prompt logprobs.*loglikelihood"):
            e.forced_topk([[10]], [[11]])


def test_retries_then_succeeds(mini_llama):
    with Fake("flaky", fail_first=2) as f:
        e = _engine(f, mini_llama)  # the probe itself succeeds after two 500s
        assert e.model_id == "fake-model"
        # two 500s answered the first probe request and were retried: it is not mistaken for a refusal
        assert f.requests[0][0] == "/v1/models" and e.findings["token_prompts"].ok
        assert {"generate", "token_ids", "gen_logprobs", "echo_logprobs"} <= e.usable


@pytest.mark.parametrize("mode", ["http500", "malformed", "partial"])
def test_bounded_retries_then_one_line_error(mini_llama, mode):
    with Fake("ok") as f:
        e = _engine(f, mini_llama)
        f.mode = mode
        before = f.completion_calls()
        t = time.time()
        with pytest.raises(ModelError) as ei:
            e.generate([[10, 11]], 3)
        assert f.completion_calls() - before == MAX_ATTEMPTS
        assert time.time() - t < sum(BACKOFF_S) + 5  # bounded backoff
        msg = str(ei.value)
        assert "\n" not in msg and f"{f.url}/completions" in msg and f"after {MAX_ATTEMPTS} attempts" in msg


def test_slow_server_times_out(mini_llama):
    with Fake("ok") as f:
        e = _engine(f, mini_llama, timeout_s=0.3)
        f.mode, f.delay = "slow", 1.0
        with pytest.raises(ModelError, match="completions: no reply"):
            e.generate([[10, 11]], 3)


def test_api_key_sent_never_shown(mini_llama, monkeypatch, capsys):
    monkeypatch.setenv("EVALSUITE_TEST_KEY", SECRET)
    with Fake("ok") as f:
        e = _engine(f, mini_llama, api_key_env="EVALSUITE_TEST_KEY")
        assert all(h.get("Authorization") == f"Bearer {SECRET}" for _, h in f.requests)
        f.mode = "http500"
        with pytest.raises(ModelError) as ei:
            e.generate([[1, 2]], 2)
        assert SECRET not in str(ei.value) and SECRET not in repr(e.__dict__.get("remote"))
    out = capsys.readouterr()
    assert SECRET not in out.out + out.err


def test_missing_key_variable_and_bad_url(mini_llama, monkeypatch):
    monkeypatch.delenv("EVALSUITE_NO_SUCH_KEY", raising=False)
    with Fake("ok") as f:
        with pytest.raises(ModelError, match="EVALSUITE_NO_SUCH_KEY.*not set"):
            _engine(f, mini_llama, api_key_env="EVALSUITE_NO_SUCH_KEY")
    with pytest.raises(ModelError, match="must start with http"):
        OpenAIEngine(Remote("localhost:8000/v1"), mini_llama.config, mini_llama.tokenizer)


def test_no_partial_answers_in_the_journal(mini_llama, tmp_path, monkeypatch):
    """A generate_until batch whose server fails midway records nothing as an answer."""
    from evalsuite.bench.adapter import EngineLM

    with Fake("ok") as f:
        lm = EngineLM(engine="openai", model="mini-llama", base_url=f.url, journal=str(tmp_path / "j.jsonl"),
                      progress=False)
        f.mode = "flaky"
        f.fail_first = f.completions + MAX_ATTEMPTS  # every attempt of the next call fails

        class Req:
            def __init__(self, ctx):
                self.args, self.doc = (ctx, {"until": ["\n"], "max_gen_toks": 3}), None

        with pytest.raises(ModelError):
            lm.generate_until([Req("1 + 1 ="), Req("2 + 2 =")])
        lm.journal.close()
        import json

        kinds = [json.loads(x)["kind"] for x in (tmp_path / "j.jsonl").read_text().splitlines()]
        assert kinds == ["canary"]  # the server's canary, and no answer


def test_tokenize_through_the_server_when_it_has_one(mini_llama):
    with Fake("ok") as f:
        e = _engine(f, mini_llama)
        assert e.tokenize("anything") == [1, 2]  # the fake server's ids, not the local tokenizer's
        assert any("tokenizer differs" in n for n in e.notes)
    with Fake("minimal") as f:
        e = _engine(f, mini_llama)
        assert e.tokenize("abc") == mini_llama.tokenizer.encode("abc")


def test_run_refuses_loglikelihood_over_a_server_without_echo(mini_llama, tmp_path):
    """gpqa mc needs echo prompt logprobs: refused at once, before the reference runs."""
    import os
    import subprocess
    import sys

    with Fake("minimal") as f:
        p = subprocess.run([sys.executable, "-m", "evalsuite.cli", "run", "gpqa", "--engine", "openai",
                            "--base-url", f.url, "--model", "mini-llama", "--limit", "2", "--output",
                            str(tmp_path / "r")], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    assert p.returncode == 2 and "no prompt logprobs" in p.stderr and "--variant cot" in p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "r" / "reference" / "journal.jsonl").exists()


def test_unstated_echo_path_cannot_pass(mini_llama):
    """Regression (10.3): a server that does not say its echo logprobs come from its decode path gets
    "not checked: decode path", and golden check over it cannot PASS."""
    from evalsuite import golden

    with Fake("ok") as f:
        e = _engine(f, mini_llama)
        assert "echo_logprobs" in e.usable and e.echo_path is None
        assert e.echo_not_checked and "decode path" in e.echo_not_checked[0]
        r = golden.check("mini-llama", "openai", extra={"base_url": f.url})
        assert r.verdict != "PASS" and r.not_checked


def test_journal_reuse_needs_the_same_canary(mini_llama, tmp_path):
    """The canary's logprobs are compared, not hashed: a server whose values move by less than the
    bound (a prompt cache) resumes its journal; one whose values move by more is refused in one line."""
    from evalsuite.bench.adapter import EngineLM
    from evalsuite.errors import SpecError

    j = str(tmp_path / "j.jsonl")
    with Fake("ok", lp=-0.5) as f:
        EngineLM(engine="openai", model="mini-llama", base_url=f.url, journal=j, progress=False).journal.close()
        f.lp = -0.55  # within CANARY_TOL (0.1): the same engine
        EngineLM(engine="openai", model="mini-llama", base_url=f.url, journal=j, progress=False).journal.close()
        f.lp = -0.9
        with pytest.raises(SpecError, match="canary differently.*not the same engine"):
            EngineLM(engine="openai", model="mini-llama", base_url=f.url, journal=j, progress=False)
