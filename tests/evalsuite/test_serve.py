"""`evalsuite serve` as a real HTTP server on loopback, and the openai engine through it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager

import pytest

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def served(*args: str, timeout: float = 300, port: int | None = None):
    port = port or _free_port()
    args = tuple(a for a in args if a)
    proc = subprocess.Popen([sys.executable, "-m", "evalsuite.cli", "serve", "--port", str(port), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **OFFLINE})
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + timeout
    try:
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"server exited: {proc.stderr.read()[-2000:]}")
            try:
                urllib.request.urlopen(url + "/health", timeout=2).read()
                break
            except (urllib.error.URLError, ConnectionError, OSError):
                if time.time() > deadline:
                    raise AssertionError("server did not come up") from None
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def post(url: str, body, raw: bytes | None = None) -> tuple[int, dict]:
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def cli(*args, timeout=900):
    return subprocess.run([sys.executable, "-m", "evalsuite.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **OFFLINE})


@pytest.fixture(scope="module")
def mini_server():
    with served("--engine", "reference", "--model", "mini-llama") as url:
        yield url


def test_endpoints_in_vllm_shapes(mini_server):
    models = json.loads(urllib.request.urlopen(mini_server + "/v1/models").read())
    assert models["object"] == "list" and models["data"][0]["id"] == "mini-llama"
    code, tok = post(mini_server + "/tokenize", {"model": "mini-llama", "prompt": "hi there"})
    assert code == 200 and tok["count"] == len(tok["tokens"]) > 0
    code, det = post(mini_server + "/detokenize", {"model": "mini-llama", "tokens": tok["tokens"]})
    assert code == 200 and det["prompt"] == "hi there"
    code, r = post(mini_server + "/v1/completions", {"model": "mini-llama", "prompt": tok["tokens"], "max_tokens": 4,
                                                      "temperature": 0, "logprobs": 2, "echo": True})
    assert code == 200, r
    ch = r["choices"][0]
    assert len(ch["token_ids"]) == 4 and ch["prompt_token_ids"] == tok["tokens"]
    lp = ch["logprobs"]
    n = len(tok["tokens"]) + 4
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == n
    assert lp["token_logprobs"][0] is None and all(isinstance(x, float) for x in lp["token_logprobs"][1:])
    assert [t for t, _ in lp["top_logprobs_by_id"][-1]][0] == ch["token_ids"][-1]  # greedy: chosen = top-1
    assert r["usage"]["completion_tokens"] == 4 and ch["text"].startswith("hi there")
    code, c = post(mini_server + "/v1/chat/completions", {
        "model": "mini-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
        "temperature": 0, "logprobs": True, "top_logprobs": 2})
    assert code == 200 and c["choices"][0]["message"]["role"] == "assistant"
    assert len(c["choices"][0]["logprobs"]["content"]) == len(c["choices"][0]["token_ids"])


@pytest.mark.parametrize("body,raw,code,needle", [
    (None, b"{not json", 400, "not valid JSON"),
    ({"model": "gpt-9", "prompt": "x", "max_tokens": 2}, None, 404, "does not exist"),
    ({"prompt": [5] * 5000, "max_tokens": 2}, None, 400, "maximum context length"),
    ({"prompt": "x", "max_tokens": -1}, None, 400, "max_tokens"),
    ({"prompt": "x", "max_tokens": 2, "temperature": 0.7}, None, 400, "greedily"),
    ({"prompt": [999999], "max_tokens": 2}, None, 400, "vocabulary"),
    ({"prompt": "x", "max_tokens": 2, "repetition_penalty": 1.2}, None, 400, "repetition_penalty must be 1"),
    ({"prompt": "x", "max_tokens": 2, "frequency_penalty": 0.5}, None, 400, "frequency_penalty must be 0"),
])
def test_bad_requests_get_4xx_and_the_server_stays_up(mini_server, body, raw, code, needle):
    got, err = post(mini_server + "/v1/completions", body, raw)
    assert got == code and needle in err["error"]["message"], err
    ok, r = post(mini_server + "/v1/completions", {"prompt": "ok", "max_tokens": 1})
    assert ok == 200 and len(r["choices"][0]["token_ids"]) == 1


def test_oversized_body_is_refused_before_it_is_read(mini_server):
    """A 2 MiB declared body gets 413 without the server reading it (the client may still be sending)."""
    host, port = mini_server.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 2097152\r\n\r\n" + b"{" + b" " * 1000)
        reply = b""
        while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
            chunk = s.recv(65536)
            if not chunk:
                break
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 413") and b"exceeds" in reply
    ok, r = post(mini_server + "/v1/completions", {"prompt": "ok", "max_tokens": 1})
    assert ok == 200


def test_eight_concurrent_requests_equal_eight_sequential(mini_server):
    prompts = ["The capital of France is", "def fib(n):", "Water boils at", "1, 2, 3, 4,",
               "The opposite of hot is", "Once upon a time", "Photosynthesis converts", "Q: What is 7 * 8?\nA:"]

    rows = []

    def ask(p):
        code, r = post(mini_server + "/v1/completions", {"prompt": p, "max_tokens": 12, "temperature": 0})
        assert code == 200, r
        rows.append(r["evalsuite"]["batch_rows"])
        return r["choices"][0]["token_ids"]

    sequential = [ask(p) for p in prompts]
    assert rows == [1] * 8
    rows.clear()
    out: dict[int, list] = {}
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, ask(prompts[i]))) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [out[i] for i in range(8)] == sequential
    assert max(rows) > 1  # the concurrent ones really were batched together


@pytest.mark.parametrize("engine,fault,verdict", [("megakernel", None, "PASS"),
                                                  pytest.param("megakernel", "drop_layer", "FAIL",
                                                               marks=pytest.mark.heavy),
                                                  # heavy (28 s): CI FAILs a served faulted engine in
                                                  # test_faulted_served_engine_fails_golden_and_moves_gpqa_scores
                                                  # and stale_feedback in test_run and test_evidence
                                                  pytest.param("megakernel", "stale_feedback", "FAIL",
                                                               marks=pytest.mark.heavy),
                                                  # a server decoding speculatively, against the reference
                                                  ("spec", None, "PASS"),
                                                  pytest.param("spec", "bonus_row", "FAIL", marks=pytest.mark.heavy)])
def test_diff_over_the_api(engine, fault, verdict, tmp_path):
    """mini-llama servers (fast); a generation-loop fault is caught over the API as in-process, and the
    report of a FAIL over the API is written (it crashed before: KeyError 'dlogit')."""
    args = ["--engine", engine, "--model", "mini-llama"] + (["--fault", fault] if fault else [])
    if engine == "spec":  # drafts that reach every acceptance length
        args += ["--engine-option", "drafter=sweep"]
    with served(*args) as url:
        p = cli("diff", "--engine", "openai", "--base-url", url + "/v1", "--against", "reference",
                "--model", "mini-llama", "--prompts", "quick", "--max-new-tokens", "12", "--json",
                "--report", str(tmp_path / "rep"))
    r = json.loads(p.stdout)
    assert r["verdict"] == verdict, (r["real_mismatches"], p.stderr[-1000:])
    assert p.returncode == (0 if verdict == "PASS" else 1)
    assert "echo_logprobs" in r["engine_capabilities"] and r["checks_not_possible"]
    if verdict == "PASS":
        assert r["summary"]["max_dlogprob"]["max"] <= r["logprob_tolerance"]
    assert (tmp_path / "rep" / "report.md").is_file() and (tmp_path / "rep" / "dlogit.png").is_file()


def test_a_served_bf16_engine_cannot_pass_without_the_logit_scale_check():
    """Regression: a served bf16 megakernel with final_norm_eps (a logit-scale error under the bf16 drift bound,
    caught in-process only by the logit-scale check, which needs full logits) PASSed `diff` over the API. With
    that check unrun, bf16 over an API is INCONCLUSIVE and says why."""
    with served("--engine", "megakernel", "--model", "mini-llama", "--dtype", "bfloat16",
                "--fault", "final_norm_eps") as url:
        p = cli("diff", "--engine", "openai", "--base-url", url + "/v1", "--model", "mini-llama",
                "--dtype", "bfloat16", "--prompts", "quick", "--max-new-tokens", "32", "--json")
    r = json.loads(p.stdout)
    assert p.returncode == 3 and r["verdict"] == "INCONCLUSIVE", (r["verdict"], r["not_checked"], p.stderr[-1000:])
    assert r["real_mismatches"] == 0 and r["bf16_drift"]["checked"] and r["bf16_drift"]["ok"]  # what it passed
    assert not r["bf16_logit_scale"]["checked"] and any("logit-scale" in n for n in r["not_checked"])


def test_faulted_served_engine_fails_golden_and_moves_gpqa_scores(tmp_path):
    """Regression (10.3): echo logprobs came from the server's XLA prefill, so a served drop_layer
    megakernel PASSed golden check and scored GPQA multiple choice exactly as the reference. Echo now
    comes from the decode path: golden check FAILs, and the per-choice loglikelihoods differ."""
    with served("--engine", "megakernel", "--model", "mini-llama", "--fault", "drop_layer") as url:
        g = cli("golden", "check", "--engine", "openai", "--base-url", url + "/v1", "--model", "mini-llama", "--json")
        p = cli("run", "gpqa", "--engine", "openai", "--base-url", url + "/v1", "--model", "mini-llama",
                "--limit", "6", "--output", str(tmp_path / "g"), "--json")
        claim = cli("diff", "--engine", "openai", "--base-url", url + "/v1", "--model", "mini-llama",
                    "--dtype", "bfloat16", "--prompts", "quick")
    assert g.returncode == 1 and json.loads(g.stdout)["verdict"] == "FAIL", g.stdout[-2000:]
    r = json.loads(p.stdout)
    recs = {e: [json.loads(x)["response"] for x in (tmp_path / "g" / e / "records.jsonl").read_text().splitlines()]
            for e in ("reference", "openai")}
    assert all(a != b for a, b in zip(recs["reference"], recs["openai"])), recs
    assert r["engines"]["openai"]["accuracy"] is not None
    # a claimed dtype that contradicts the server's reported one is a usage error (10.9)
    assert claim.returncode == 2 and "contradicts the server" in claim.stderr and "Traceback" not in claim.stderr


@pytest.mark.heavy  # 17 s in CI's run
def test_swapped_server_behind_the_same_url_is_not_reused(tmp_path):
    """Regression (10.2): a journal written against one served engine was reused for another at the
    same URL. The key holds the server's identity and canary now."""
    port = _free_port()
    out = str(tmp_path / "r")
    counts = []
    for engine in ("reference", "megakernel"):
        with served("--engine", engine, "--model", "mini-llama", "--fault" if engine == "megakernel" else "",
                    "kv_stale" if engine == "megakernel" else "", port=port) as url:
            p = cli("run", "sanity", "--engine", "openai", "--base-url", url + "/v1", "--model", "mini-llama",
                    "--limit", "4", "--output", out, "--json")
            assert p.returncode in (1, 3), p.stderr[-2000:]
        lines = (tmp_path / "r" / "openai" / "journal.jsonl").read_text().splitlines()
        counts.append(sum(json.loads(x)["kind"] != "canary" for x in lines))
    assert counts == [4, 8]  # the second server's answers were computed, none reused (and each has its canary)


def test_run_gsm8k_through_the_api_matches_in_process(mini_server, tmp_path):
    p = cli("run", "gsm8k", "--engine", "openai", "--base-url", mini_server + "/v1", "--model", "mini-llama",
            "--limit", "8", "--output", str(tmp_path / "r"), "--json")
    assert p.returncode == 3, p.stderr[-2000:]  # 8 items: too few for a PASS
    r = json.loads(p.stdout)
    assert set(r["engines"]) == {"reference", "openai"}
    recs = {e: [json.loads(x) for x in (tmp_path / "r" / e / "records.jsonl").read_text().splitlines()]
            for e in ("reference", "openai")}
    assert [x["extracted"] for x in recs["openai"]] == [x["extracted"] for x in recs["reference"]]
    assert [x["response"] for x in recs["openai"]] == [x["response"] for x in recs["reference"]]
    assert r["verdict"] == "INCONCLUSIVE" and r["paired"]["b"] == r["paired"]["c"] == 0
    # the parity part over the API: the served megakernel's ids and top-5 logprobs against the judge's greedy track
    pa = r["parity"]
    assert pa["judged"] and pa["items"] == 8 and pa["items_failing"] == 0 and pa["not_checked"] == []
    # a server that declares numerics of its own has its parity reported, not judged
    q = cli("run", "gsm8k", "--engine", "openai", "--base-url", mini_server + "/v1", "--model", "mini-llama",
            "--limit", "2", "--engine-option", "numerics=Q8_0 weights", "--output", str(tmp_path / "q"), "--json")
    assert q.returncode == 3, q.stderr[-2000:]
    pq = json.loads(q.stdout)["parity"]
    assert not pq["judged"] and "Q8_0 weights" in pq["why_not_judged"] and pq["items"] == 2


def test_cli_errors_are_one_line():
    p = cli("diff", "--engine", "openai", "--model", "mini-llama")
    assert p.returncode == 2 and "needs --base-url" in p.stderr and "Traceback" not in p.stderr
    port = _free_port()  # nothing listens there
    p = cli("generate", "--engine", "openai", "--base-url", f"http://127.0.0.1:{port}/v1", "--model", "mini-llama",
            "--timeout", "2")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert f"GET http://127.0.0.1:{port}/v1/models: no reply" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_golden_check_over_the_api(mini_server):
    p = cli("golden", "check", "--engine", "openai", "--base-url", mini_server + "/v1", "--model", "mini-llama",
            "--json")
    r = json.loads(p.stdout)
    assert p.returncode == 0 and r["verdict"] == "PASS", r
    s = r["models"]["mini-llama"]["summary"]
    assert s["positions"] > 0 and s["max_dlogprob"] <= 1e-3 and "teacher-forced by its decode path" in s["measure"]


def test_echo_from_a_position_and_concurrent_echoes_batch(mini_server):
    """`echo_logprobs_from` skips the prompt's positions before it (null, not computed) and leaves the
    rest as a full echo gives them; concurrent echoes are scored in one forced_topk call
    (`echo_batch_rows` > 1) with the logprobs they get one at a time (what made a served `diff` 1.8x
    faster: benchmarks/false_alarms.py)."""
    def echo(ids, **extra):
        code, r = post(mini_server + "/v1/completions", {"prompt": ids, "max_tokens": 0, "temperature": 0,
                                                          "logprobs": 2, "echo": True, **extra})
        assert code == 200, r
        return r["choices"][0]["logprobs"], r["evalsuite"]["echo_batch_rows"]

    ids = [[5 + 7 * i + j for j in range(9 + i)] for i in range(6)]
    full, rows = echo(ids[0])
    assert rows == 1 and full["token_logprobs"][0] is None and None not in full["token_logprobs"][1:]
    part, _ = echo(ids[0], echo_logprobs_from=6, echo_decode_from=5)
    assert part["token_logprobs"][:6] == [None] * 6 and part["top_logprobs_by_id"][:6] == [None] * 6
    assert [t for t, _ in part["top_logprobs_by_id"][6][:1]] == [t for t, _ in full["top_logprobs_by_id"][6][:1]]
    assert max(abs(a - b) for a, b in zip(part["token_logprobs"][6:], full["token_logprobs"][6:])) < 1e-4
    code, _ = post(mini_server + "/v1/completions", {"prompt": ids[0], "max_tokens": 0, "echo": True, "logprobs": 1,
                                                     "echo_logprobs_from": 0})
    assert code == 400
    alone = [echo(x, echo_decode_from=len(x) - 3, echo_logprobs_from=len(x) - 2)[0] for x in ids]
    out: dict[int, tuple] = {}
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(
        i, echo(ids[i], echo_decode_from=len(ids[i]) - 3, echo_logprobs_from=len(ids[i]) - 2))) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max(out[i][1] for i in range(6)) > 1  # scored together
    for i in range(6):
        got, want = out[i][0]["token_logprobs"][-2:], alone[i]["token_logprobs"][-2:]
        assert max(abs(a - b) for a, b in zip(got, want)) < 1e-5, (i, got, want)
