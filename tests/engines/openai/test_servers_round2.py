"""Servers people run, round 2: transformers serve's quirks, a single-threaded server, a server that dies
mid-run, and what the client learns and says about each. Most run the project's quirk server (a real
`evalsuite serve` of mini-llama on loopback behind a layer that reproduces the behaviour)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from engines.base import Generation
from engines.errors import ModelError
from engines.openai import client as client_mod
from engines.openai import pace, parse, probe
from engines.openai.client import OpenAIEngine, Remote
from tests.engines.openai.fake_server import Fake
from tests.engines.openai.quirk_server import LLAMA_CPP, TSERVE, QuirkServer


def _engine(url, model, timeout_s=None) -> OpenAIEngine:
    return OpenAIEngine(Remote(url, timeout_s=timeout_s), model.config, model.tokenizer)


def _completions(srv, since: int = 0) -> list[dict]:
    return [json.loads(b) for p, _, b, _ in srv.log[since:] if p == "/v1/completions"]


# ---- 1. a slow, single-threaded server: one request at a time, deadlines from its pace, said on the console ----
def test_a_serial_server_gets_one_request_at_a_time_and_the_console_hears_of_the_wait(mini_llama, monkeypatch):
    with QuirkServer(mini_llama, {"serial", "single_prompt"}) as srv:
        e = _engine(srv.url, mini_llama)
        pace = e.findings["pace"]
        assert e.concurrency == 1 and "one at a time" in pace.detail and e.tokens_per_s > 0
        heard: list[str] = []
        e.notify = heard.append
        monkeypatch.setattr(client_mod, "WAIT_REPORT_S", 0.3)
        start = len(srv.log)
        prompts = [mini_llama.tokenizer.encode(t) for t in ("a b", "c d", "e f", "g h")]
        gens = e.generate(prompts, 4)
        assert len(gens) == 4 and all(len(g.token_ids) >= 1 for g in gens)
        sent = _completions(srv, start)
        assert len(sent) == 4  # one request a prompt (the server takes one prompt), none sent twice
        assert heard and all(h.startswith("server busy: ") and "queued here" in h for h in heard)
        assert e.deadline({"prompt": "x" * 300, "max_tokens": 256}) >= client_mod.TIMEOUT_S
    with QuirkServer(mini_llama, ()) as srv:  # control: a server that batches what arrives together
        e = _engine(srv.url, mini_llama)
        assert e.concurrency == client_mod.CONCURRENT_REQUESTS and "overlaps" in e.findings["pace"].detail


def test_a_generation_that_gets_no_reply_is_never_sent_again(mini_llama):
    with Fake("ok") as f:
        e = _engine(f.url, mini_llama, timeout_s=0.3)
        before = f.completion_calls()
        f.mode, f.delay = "slow", 1.0
        with pytest.raises(ModelError) as ei:
            e.generate([[10, 11]], 3)
        msg = str(ei.value)
        assert f.completion_calls() - before == 1  # no retry: the server may still be running it
        assert "no reply in 0 s" in msg and "not sent again" in msg and "--timeout" in msg and "\n" not in msg


def test_the_learned_deadline_grows_with_the_work_and_never_falls_under_the_floor():
    class E:
        tokens_per_s, prefill_per_s = 10.0, 100.0

    assert pace.deadline(E(), {"prompt": [1] * 10, "max_tokens": 8}) == client_mod.TIMEOUT_S
    long = pace.deadline(E(), {"prompt": [[1] * 1000] * 16, "max_tokens": 256})
    assert long == pytest.approx(pace.DEADLINE_FACTOR * (16_000 / 100 + 16 * 256 / 10) + pace.PACE_SLACK_S)


# ---- 7. a server that dies mid-run is named, with the request after which it stopped answering ---------------
def test_a_server_that_dies_mid_request_is_named_with_the_request_before(mini_llama):
    with QuirkServer(mini_llama, {"serial", "single_prompt"}) as srv:  # one request at a time: a fixed order
        e = _engine(srv.url, mini_llama)
        srv.set_dies(2)  # the second completion from now: no reply, and nothing listens afterwards
        prompts = [mini_llama.tokenizer.encode(t) for t in ("one", "two", "three")]
        with pytest.raises(ModelError) as ei:
            e.generate(prompts, 3)
        msg = str(ei.value)
    assert "\n" not in msg and "has stopped answering" in msg and "refuses even GET /v1/models" in msg
    assert "the last request it answered was POST /v1/completions (1 prompt, max_tokens 3" in msg
    assert "got no reply (" in msg and "Connection refused" in msg.split("refuses even")[1]
    assert "crashed" in msg and "server's own log" in msg
    assert sum(1 for p, st, _, _ in srv.log if p == "/v1/completions" and st == 0) >= 1  # (others were in flight)


def test_the_probe_asks_for_several_prompts_last_and_once(mini_llama):
    """llama-cpp-python's server answers a list of prompts with an assertion (500); the probe sends that request
    once, after every other question, so a server that breaks on it has already told everything else."""
    with QuirkServer(mini_llama, LLAMA_CPP) as srv:
        e = _engine(srv.url, mini_llama)
        sent = _completions(srv)
        lists = [i for i, b in enumerate(sent) if isinstance(b["prompt"], list)
                 and any(isinstance(x, str) for x in b["prompt"])]
        assert len(lists) == 1 and lists[0] == len(sent) - 1
        assert e.findings["batched_prompts"].ok is False and "after 1 attempt" in e.findings["batched_prompts"].detail
        assert list(e.findings)[-1] == "batched_prompts"


# ---- 2, 3, 5, 8. transformers serve: text only, special tokens stripped, stop strings kept, no logprobs -------
@pytest.fixture(scope="module")
def tserve_like(mini_llama):
    with QuirkServer(mini_llama, TSERVE) as srv:
        yield srv


def test_the_probe_reads_transformers_serve_right(tserve_like, mini_llama):
    e = _engine(tserve_like.url, mini_llama)
    f = e.findings
    assert f["token_prompts"].ok is False and "prompt must be a string" in f["token_prompts"].detail
    assert f["tokenize"].ok is False and f["gen_logprobs"].ok is False and f["echo_logprobs"].ok is False
    assert f["ignore_eos"].ok is False and "422" in f["ignore_eos"].detail
    assert f["stop_strings"].ok is False and "keeps it in its text" in f["stop_strings"].detail and e.stops_kept
    assert e.concurrency == 1 and e.prompt_not_checked


def test_a_kept_stop_string_is_cut_off_and_sent(tserve_like, mini_llama):
    e = _engine(tserve_like.url, mini_llama)
    p = mini_llama.tokenizer.encode("a b c")
    free = e.generate([p], 12)[0]
    text = mini_llama.tokenizer.decode(free.token_ids)
    stop = text.strip()[2:5] if len(text.strip()) > 6 else None
    if not stop:
        pytest.skip("the mini model's text offers no stop string")
    start = len(tserve_like.log)
    g = e.generate([p], 12, stop_strings=[stop])[0]
    assert _completions(tserve_like, start)[0].get("stop") == [stop]  # sent: the server stops early
    assert stop not in (g.text or mini_llama.tokenizer.decode(g.token_ids))
    if g.finish_reason == "stop":  # cut here: its re-tokenized ids at the cut are not the server's own
        assert not g.ids_exact and g.text is not None


def test_usage_counts_decide_whether_retokenized_ids_are_trusted(smollm2):
    tok = smollm2.tokenizer
    ids = tok.encode("The answer is 4.")
    ch = {"text": "The answer is 4.", "finish_reason": "length", "logprobs": None}
    g = parse.generation(tok, [1], ch, set(), 5, counted=len(ids))
    parse.cross_check(g)
    assert g.ids_exact and g.token_ids == ids and g.counted == len(ids)
    g = parse.generation(tok, [1], ch, set(), 5, counted=len(ids) + 1)  # a special token the text does not show
    parse.cross_check(g)
    assert not g.ids_exact and g.text == "The answer is 4."
    assert parse.counted({"usage": {"completion_tokens": 256}}, 1) == 256
    assert parse.counted({"usage": {"completion_tokens": 512}}, 2) is None  # a sum over two choices


def test_text_without_special_tokens_matches_by_the_servers_count(smollm2):
    from evalsuite.compare import text

    tok = smollm2.tokenizer
    tokens = tok.encode("Paris.") + tok.encode("<|im_start|>") + tok.encode("Rome")
    shown = tok.decode(tokens, skip_special=True)
    assert shown != tok.decode(tokens)

    def gen(counted):
        return Generation([1], tok.encode(shown), np.full((0, 1), -1), np.zeros((0, 1)), "length", ids_exact=False,
                          text=shown, counted=counted)

    g = gen(len(tokens))
    assert text.resolve(tok, tokens, g) == text.TEXT_NO_SPECIAL and g.token_ids == tokens and g.ids_exact
    assert text.resolve(tok, tokens, gen(len(tokens) + 2)) == text.UNRESOLVED  # a count that does not fit
    other = Generation([1], [], np.full((0, 1), -1), np.zeros((0, 1)), "length", ids_exact=False, text="Paris.Roma",
                       counted=len(tokens))
    assert text.resolve(tok, tokens, other) == text.UNRESOLVED  # a real difference stays one


@pytest.mark.heavy  # CI: verify's diff part over the same server, its report and results.json (test_verify_keeps_...)
def test_diff_over_transformers_serve_quirks_reports_no_false_difference_and_no_unmeasured_number(
        tserve_like, tmp_path):
    from evalsuite.compare.diff import DiffSpec, run_diff
    from evalsuite.report import diff_report

    r = run_diff(DiffSpec(engine="openai", model="mini-llama", prompts="quick", max_new_tokens=16,
                          engine_options=(("base_url", tserve_like.url),))).to_json()
    assert r["verdict"] == "INCONCLUSIVE" and r["real_mismatches"] == 0
    assert not any("differs from the reference's" in n for n in r["not_checked"])
    assert r["summary"]["argmax_agreement"] is None and r["observed_noise"] == {"n": 0}
    diff_report(r, tmp_path)
    raw = (tmp_path / "results.json").read_text()
    json.loads(raw, parse_constant=lambda c: pytest.fail(f"bare {c} in results.json"))
    md = (tmp_path / "report.md").read_text()
    assert "0.00e+00" not in md and "argmax agreement not measured" in md
    assert "where the argmax agrees: not measured" in md


def test_strict_json_has_null_where_nothing_was_measured():
    from evalsuite.report import dumps

    out = dumps({"a": float("nan"), "b": [1.0, float("inf")], "c": {"d": -math.inf}, "e": 2})
    assert json.loads(out, parse_constant=lambda c: pytest.fail(c)) == {"a": None, "b": [1.0, None],
                                                                        "c": {"d": None}, "e": 2}


# ---- 6. a server serving another model is told apart from one that adds a BOS token -------------------------
def test_a_prompt_count_mismatch_says_what_it_most_likely_means():
    class E:
        model_id = "Qwen/Qwen2.5-0.5B"
        findings = {"tokenize": probe.Finding(False, "no tokenize endpoint")}

    another = probe.count_mismatch(E(), 34, 13)
    assert "another model" in another and "Qwen/Qwen2.5-0.5B" in another and "BOS" not in another
    assert "BOS" in probe.count_mismatch(E(), 14, 13)
    E.findings = {"tokenize": probe.Finding(True, "POST /tokenize; it tokenizes differently from --model's")}
    assert "tokenizer differs" in probe.count_mismatch(E(), 34, 13)


# ---- 4. verify keeps every part's verdict; a part that cannot run is "not checked", never dropped -------------
def test_verify_keeps_what_it_proved_when_a_part_cannot_run(tserve_like, tmp_path):
    from evalsuite.verify import run_verify

    r = run_verify("mini-llama", "openai", "float32", None, tmp_path, lambda m: None, tasks=("gpqa",), limit=2,
                   prompts="quick", engine_options=(("base_url", tserve_like.url),),
                   parts_asked=("golden", "diff", "gpqa")).to_json()
    assert r["verdict"] == "INCONCLUSIVE"
    parts = r["parts"]
    assert parts["diff"]["verdict"] == "INCONCLUSIVE" and parts["diff"]["ran"]
    for name in ("golden", "gpqa"):  # no prompt logprobs: they cannot run, and say why
        assert parts[name]["ran"] is False and "echo" in parts[name]["not_checked"]
    assert "--gpqa-variant cot" in parts["gpqa"]["not_checked"] and "--variant cot" not in parts["gpqa"][
        "not_checked"].replace("--gpqa-variant cot", "")
    assert set(r["parts_not_run"]) == {"sanity", "gsm8k"}
    assert json.loads((tmp_path / "verify.json").read_text())["verdict"] == "INCONCLUSIVE"
    md = (tmp_path / "report.md").read_text()
    assert "| golden | INCONCLUSIVE | not checked:" in md and "| gsm8k | not run |" in md
    assert parts["diff"]["real_mismatches"] == 0  # no false difference over transformers serve's quirks
    raw = (tmp_path / "diff" / "results.json").read_text()
    d = json.loads(raw, parse_constant=lambda c: pytest.fail(f"bare {c} in results.json"))
    assert d["summary"]["argmax_agreement"] is None and not any("differs from the reference's" in n
                                                                for n in d["not_checked"])
    dmd = (tmp_path / "diff" / "report.md").read_text()
    assert "0.00e+00" not in dmd and "argmax agreement not measured" in dmd


def test_verify_parts_are_checked_before_any_work(tmp_path):
    from click.testing import CliRunner

    from evalsuite.cli import main

    res = CliRunner().invoke(main, ["verify", "--model", "mini-llama", "--parts", "diff,golds", "--output",
                                    str(tmp_path)])
    assert res.exit_code == 2 and "--parts 'diff,golds': unknown ['golds']" in res.output
    assert not any(tmp_path.iterdir())


def test_another_model_behind_the_url_is_refused_as_such(mini_llama):
    with QuirkServer(mini_llama, {"text_only", "no_tokenize", "another_model"}) as srv:
        with pytest.raises(ModelError) as ei:
            _engine(srv.url, mini_llama)
    msg = str(ei.value)
    assert "another model than --model" in msg and "BOS" not in msg and "\n" not in msg


@pytest.mark.heavy  # CI: the same class through `run`'s parity part (test_run_does_not_fail_parity_on_...)
def test_a_prompt_the_servers_tokenizer_reads_otherwise_is_not_judged_as_tokens(mini_llama):
    """Only long prompts are counted otherwise: the canary passes, and those rows are 'not comparable', never a
    FAIL built on tokens the server never read."""
    from evalsuite.compare.diff import DiffSpec, run_diff

    with QuirkServer(mini_llama, TSERVE | {"long_split"}) as srv:
        r = run_diff(DiffSpec(engine="openai", model="mini-llama", prompts="quick", max_new_tokens=8,
                              engine_options=(("base_url", srv.url),))).to_json()
    assert r["verdict"] == "INCONCLUSIVE" and r["real_mismatches"] == 0
    split = [n for n in r["not_checked"] if "read the prompt as" in n]
    assert split and all("not comparable token for token" in n for n in split)


def test_run_does_not_fail_parity_on_prompts_the_server_read_otherwise(tmp_path):
    """gsm8k's 5-shot prompts are long: the server counts each one token longer. Parity must not judge those answers
    token for token (a FAIL there would rest on tokens the server never read): the run ends INCONCLUSIVE."""
    from evalsuite.bench.run import RunSpec, run_benchmark
    from evalsuite.models import load_model

    with QuirkServer(load_model("mini-llama"), TSERVE | {"long_split"}) as srv:
        r = run_benchmark(RunSpec(task="gsm8k", engine="openai", model="mini-llama", limit=2, output=str(tmp_path),
                                  engine_options=(("base_url", srv.url),)), lambda m: None).to_json()
    assert r["verdict"] == "INCONCLUSIVE" and "parity" not in r["failed_by"]
    assert any("read 2 prompt(s) as a different number of tokens" in w for w in r["warnings"])
    records = [json.loads(x) for x in (tmp_path / "openai" / "records.jsonl").read_text().splitlines()]
    assert all("read the prompt as" in rec["parity"]["not_checked"] for rec in records)
