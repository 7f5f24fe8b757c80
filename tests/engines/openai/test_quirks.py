"""Each quirk of third-party servers, reproduced by the quirk server (a real `evalsuite serve` of
mini-llama behind a rewriting layer): the probe names it, the commands refuse in one line or report
"not checked", and nothing refused is ever retried."""

from __future__ import annotations

import json

import pytest

from engines.errors import ModelError
from engines.openai.client import OpenAIEngine, Remote
from engines.openai.http import classify
from tests.engines.openai.quirk_server import LLAMA_CPP, QuirkServer


def _engine(srv, model) -> OpenAIEngine:
    return OpenAIEngine(Remote(srv.url), model.config, model.tokenizer)


def _diff(url: str, prompts: str = "quick", n: int = 8, model: str = "mini-llama") -> dict:
    from evalsuite.compare.diff import DiffSpec, run_diff

    spec = DiffSpec(engine="openai", model=model, prompts=prompts, max_new_tokens=n,
                    engine_options=(("base_url", url),))
    return run_diff(spec).to_json()


# ---- error classification (no server needed) --------------------------------------------------------
def test_validation_error_as_500_is_final_and_names_the_field():
    body = json.dumps({"error": {"message": "3 validation errors:\n  {'type': 'string_type', 'loc': ('body', "
                                           "'prompt', 'str'), 'msg': 'Input should be a valid string', 'input': "
                                           "[504, 14540]}\n"}}).encode()
    f = classify(500, body)
    assert not f.retry and "'prompt'" in f.message and "\n" not in f.message
    detail = [{"loc": ["body", "max_tokens"], "msg": "Input should be a valid integer", "type": "int_type"}]
    f = classify(422, json.dumps({"detail": detail}).encode())
    assert not f.retry and "'max_tokens'" in f.message
    assert classify(503, b'{"error": {"message": "overloaded"}}').retry
    assert classify(500, b'{"error": {"message": ""}}').retry
    assert not classify(404, b'{"detail": "Not Found"}').retry and not classify(429, b"").retry


# ---- the llama.cpp server's quirks, together, on the real model it serves ------------------------------
@pytest.fixture(scope="module")
def llama_like(smollm2):
    with QuirkServer(smollm2, LLAMA_CPP) as srv:
        yield srv


@pytest.mark.slow
@pytest.mark.heavy  # CI: the same findings asserted from the diff below (one probe instead of two)
def test_probe_reports_llama_cpp_capabilities_right(llama_like, smollm2, smollm2_ref):
    llama_like.mark()
    e = _engine(llama_like, smollm2)
    f = e.findings
    assert f["token_prompts"].ok is False and "'prompt'" in f["token_prompts"].detail
    assert f["batched_prompts"].ok is False and f["tokenize"].ok and "/extras/tokenize" in f["tokenize"].detail
    assert f["token_ids"].ok is False and "token strings" in f["token_ids"].detail
    assert f["gen_logprobs"].ok and f["greedy"].ok
    assert f["echo_logprobs"].ok and f["echo_consistency"].ok is False and "MISALIGNED" in f["echo_consistency"].detail
    assert f["chat"].ok and f["stop_strings"].ok and f["max_context"].ok is False
    assert e.usable == {"generate", "gen_logprobs", "tokenize", "stop_strings", "chat"}
    assert not e.prompt_not_checked  # text prompts, each checked through /extras/tokenize
    with pytest.raises(ModelError, match="MISALIGNED"):
        e.forced_topk([[504, 3458]], [[314]])
    # prompts travel as text, one per request, and come back as the reference's greedy tokens
    ps = [smollm2.tokenizer.encode("The capital of France is"), smollm2.tokenizer.encode("1, 2, 3,")]
    g = e.generate(ps, 6, top_k=2)
    r = smollm2_ref.generate(ps, 6, top_k=2)
    assert [x.token_ids for x in g] == [x.token_ids for x in r] and all(x.ids_exact for x in g)
    assert llama_like.retried_refusals() == []


@pytest.mark.heavy  # 64 s on smollm2; CI keeps the refusal logic in test_unverifiable_echo_is_refused (mini-llama)
def test_diff_and_refusals_over_llama_cpp_quirks(llama_like, tmp_path):
    """diff completes with a verdict (the served engine IS the reference: nothing may FAIL); golden
    check and loglikelihood tasks are refused in one line naming the misaligned echo."""
    from evalsuite import golden
    from evalsuite.bench.run import RunSpec, run_benchmark
    from evalsuite.errors import SpecError

    llama_like.mark()
    r = _diff(llama_like.url, model="smollm2-135m", n=4)
    assert r["verdict"] == "PASS" and r["real_mismatches"] == 0, r["not_checked"]
    f = r["engine_capabilities"]
    assert f["echo_consistency"]["ok"] is False and "MISALIGNED" in f["echo_consistency"]["detail"]
    assert any("MISALIGNED" in n for n in r["checks_not_possible"])
    assert (f["token_prompts"]["ok"], f["batched_prompts"]["ok"], f["token_ids"]["ok"]) == (False, False, False)
    assert f["tokenize"]["ok"] and "/extras/tokenize" in f["tokenize"]["detail"] and f["max_context"]["ok"] is False
    assert f["gen_logprobs"]["ok"] and f["greedy"]["ok"] and f["echo_logprobs"]["ok"] and f["chat"]["ok"]
    assert f["stop_strings"]["ok"] and not r["not_checked"]  # text prompts, each checked through /extras/tokenize
    assert llama_like.retried_refusals() == []
    llama_like.mark()
    with pytest.raises(ModelError) as ei:
        golden.check("smollm2-135m", "openai", extra={"base_url": llama_like.url})
    assert "MISALIGNED" in str(ei.value) and "\n" not in str(ei.value)
    assert llama_like.retried_refusals() == []
    llama_like.mark()
    with pytest.raises(SpecError, match="MISALIGNED.*--variant cot"):
        run_benchmark(RunSpec(task="gpqa", engine="openai", model="smollm2-135m", limit=2,
                              output=str(tmp_path / "r"), engine_options=(("base_url", llama_like.url),)))
    assert llama_like.retried_refusals() == []


def test_unverifiable_echo_is_refused(mini_llama):
    """mini-llama's random bytes are not valid UTF-8, so without token ids the canary's tokens cannot be
    rebuilt and echo's alignment cannot be checked: echo is then refused, never used unverified."""
    with QuirkServer(mini_llama, {"no_token_ids", "misaligned_echo"}) as srv:
        e = _engine(srv, mini_llama)
        assert e.findings["echo_logprobs"].ok and e.findings["echo_consistency"].ok is None
        assert "echo_logprobs" not in e.usable
        with pytest.raises(ModelError, match="echo consistency: not checked"):
            e.forced_topk([[72, 105]], [[33]])


# ---- one quirk at a time -------------------------------------------------------------------------------
def test_misaligned_echo_alone_is_named_and_refused(mini_llama):
    with QuirkServer(mini_llama, {"misaligned_echo"}) as srv:
        e = _engine(srv, mini_llama)
        assert e.findings["token_prompts"].ok and e.findings["token_ids"].ok
        assert "MISALIGNED" in e.findings["echo_consistency"].detail and "echo_logprobs" not in e.usable
        with pytest.raises(ModelError, match="MISALIGNED"):
            e.forced_topk([[72, 105]], [[33]])
    with QuirkServer(mini_llama, ()) as srv:  # control: the same server without the quirk
        e = _engine(srv, mini_llama)
        assert e.findings["echo_consistency"].ok and "echo_logprobs" in e.usable


def test_text_prompts_without_tokenize_cannot_pass(mini_llama):
    """No token-id prompts and no tokenize endpoint: what the server read cannot be confirmed, so diff is
    INCONCLUSIVE although every token matches (the same server with /tokenize PASSes)."""
    with QuirkServer(mini_llama, {"no_token_prompts", "no_tokenize"}) as srv:
        e = _engine(srv, mini_llama)
        assert e.findings["tokenize"].ok is False and e.prompt_not_checked
        assert srv.retried_refusals() == []
        srv.mark()
        r = _diff(srv.url)
        assert r["verdict"] == "INCONCLUSIVE" and r["real_mismatches"] == 0
        assert any("prompt tokenization" in n for n in r["not_checked"])
        assert srv.retried_refusals() == []
    with QuirkServer(mini_llama, {"no_token_prompts"}) as srv:
        r = _diff(srv.url)
        assert r["verdict"] == "PASS" and not r["not_checked"]


def test_strict_schema_refusals_are_final_and_named(mini_llama):
    """A server that rejects every non-OpenAI field (as a 500 validation error): the probe drops the
    extension fields it refuses, names them, and never repeats a refused request."""
    with QuirkServer(mini_llama, {"strict_schema_500"}) as srv:
        e = _engine(srv, mini_llama)
        assert e.findings["ignore_eos"].ok is False and "'ignore_eos'" in e.findings["ignore_eos"].detail
        ns = e.findings["neutral_sampling"]
        assert ns.ok is False and "'repeat_penalty'" in ns.detail
        assert e.findings["echo_consistency"].ok  # echo still works: only the extension fields are refused
        g = e.generate([mini_llama.tokenizer.encode("Hi")], 3)
        assert len(g[0].token_ids) >= 1
        assert srv.retried_refusals() == [] and any(st == 500 for _, st, _, _ in srv.log)


def test_lost_token_ids_are_not_judged_as_tokens(mini_llama):
    """Without token ids a byte-level model's text may not be valid UTF-8: those rows are compared as
    text (equal text: the reference's ids), never re-tokenized into a false mismatch."""
    with QuirkServer(mini_llama, {"no_token_ids"}) as srv:
        r = _diff(srv.url, n=16)
    assert r["real_mismatches"] == 0 and r["verdict"] == "PASS"
    assert r["engine_capabilities"]["token_ids"]["ok"] is False
