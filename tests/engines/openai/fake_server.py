"""A real HTTP server on loopback that misbehaves on purpose (for the openai client's tests).

It answers /v1/models normally and /v1/completions according to `mode`:
  ok        a well-formed reply (fixed token ids 5, 6, 7 and logprobs)
  minimal   well-formed but without token ids, logprobs, echo or /tokenize (a bare server)
  http500   always 500
  flaky     500 for the first `fail_first` completions, then ok
  malformed a body that is not JSON
  partial   JSON whose choices lack finish_reason (a truncated reply)
  slow      sleeps `delay` seconds before an ok reply
Every request is recorded (path, headers) so tests can count attempts and check the bearer token.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Fake:
    def __init__(self, mode: str = "ok", fail_first: int = 0, delay: float = 0.0, lp: float = -0.5):
        self.mode, self.fail_first, self.delay, self.lp = mode, fail_first, delay, lp
        self.requests: list[tuple[str, dict]] = []
        self.completions = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def _send(self, code: int, body: bytes, ctype: str = "application/json"):
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                fake.requests.append((self.path, dict(self.headers)))
                if self.path == "/v1/models":
                    self._send(200, json.dumps({"object": "list", "data": [
                        {"id": "fake-model", "object": "model", "max_model_len": 4096}]}).encode())
                else:
                    self._send(404, b'{"error": {"message": "no such route"}}')

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}")
                fake.requests.append((self.path, dict(self.headers)))
                if self.path == "/tokenize":
                    if fake.mode == "minimal":
                        return self._send(404, b'{"error": {"message": "not found"}}')
                    return self._send(200, json.dumps({"tokens": [1, 2], "count": 2}).encode())
                if self.path != "/v1/completions":
                    return self._send(404, b'{"error": {"message": "not found"}}')
                fake.completions += 1
                mode = fake.mode
                if mode == "flaky":
                    mode = "http500" if fake.completions <= fake.fail_first else "ok"
                if mode == "http500":
                    return self._send(500, b'{"error": {"message": "engine crashed"}}')
                if mode == "malformed":
                    return self._send(200, b"<html>not json", "text/html")
                if mode == "slow":
                    time.sleep(fake.delay)
                prompts = body["prompt"] if isinstance(body["prompt"][0], list) else [body["prompt"]]
                if mode == "minimal" and body.get("echo"):
                    return self._send(400, b'{"error": {"message": "echo is not supported"}}')
                choices = []
                for i, p in enumerate(prompts):
                    gen = [5, 6, 7][:max(body.get("max_tokens", 3), 1)]
                    ch = {"index": i, "text": "abc"[:len(gen)], "finish_reason": "length"}
                    if mode == "partial":
                        del ch["finish_reason"]
                    if mode != "minimal":
                        ch["token_ids"] = gen
                        k = body.get("logprobs")
                        if k is not None:
                            seq = (p if body.get("echo") else []) + gen
                            first = bool(body.get("echo"))  # echo: the first prompt token has none
                            ch["logprobs"] = {
                                "token_logprobs": [None if (first and j == 0) else fake.lp for j in range(len(seq))],
                                "top_logprobs_by_id": [None if (body.get("echo") and j == 0) else [[t, fake.lp]]
                                                       for j, t in enumerate(seq)]}
                    choices.append(ch)
                self._send(200, json.dumps({"object": "text_completion", "choices": choices}).encode())

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()

    def completion_calls(self) -> int:
        return sum(p == "/v1/completions" for p, _ in self.requests)
