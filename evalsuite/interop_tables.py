"""The interop matrix's tables in docs/engines.md, rendered from benchmarks/results/interop-matrix.json (written by
`interop/matrix.py --results`): what the probe found on each server, and how each command ended there."""

from __future__ import annotations

from pathlib import Path

from evalsuite.doctables import MISSING, _absent, _get, _load, _source, _table

INTEROP = "benchmarks/results/interop-matrix.json"
SERVERS = ("evalsuite", "llamacpp", "llamacpp-native", "tserve")
CAPABILITIES = ("token_prompts", "batched_prompts", "tokenize", "token_ids", "gen_logprobs", "greedy", "echo_logprobs",
                "echo_consistency", "ignore_eos", "neutral_sampling", "stop_strings", "chat", "max_context", "pace")


def _ok(v) -> str:
    return {True: "yes", False: "no", None: "not checked"}.get(v, MISSING)


def interop_capabilities(root: Path) -> str:
    doc = _load(root, INTEROP)
    if doc is None:
        return _absent(INTEROP)
    servers = [s for s in SERVERS if s in doc["servers"]] + [s for s in doc["servers"] if s not in SERVERS]
    rows = [[f"`{c}`", *[_ok(_get(doc, "servers", s, "engine_capabilities", c, "ok", default="?"))
                         for s in servers]] for c in CAPABILITIES]
    pace = [_get(doc, "servers", s, "engine_capabilities", "pace", "detail", default=MISSING) for s in servers]
    rows.append(["pace at the probe", *[p.split(";")[0].replace("about ", "") for p in pace]])
    rows.append(["requests at once", *["1" if "one at a time" in p else "4" if "overlaps" in p else MISSING
                                       for p in pace]])
    what = "; ".join(f"{s}: {_get(doc, 'servers', s, 'server', default=MISSING)}" for s in servers)
    return (_source(INTEROP, how=f" ({what})") + _table(["capability", *servers], rows))


def interop_commands(root: Path) -> str:
    doc = _load(root, INTEROP)
    if doc is None:
        return _absent(INTEROP)
    rows = []
    for s in [s for s in SERVERS if s in doc["servers"]]:
        for r in doc["servers"][s]["rows"]:
            how = r.get("verdict") or (f"refused: {r['refusal'].split(': ', 1)[-1][:90]}" if r.get("refusal") else
                                       MISSING)
            figures = ""
            if r.get("accuracy"):
                figures = f"{r['items']} items: " + ", ".join(f"{v:.2f}" for v in r["accuracy"].values()) + \
                    f" (b={r['b_c'][0]}, c={r['b_c'][1]})"
            elif "real_mismatches" in r:
                figures = f"{r['real_mismatches']} real mismatches" + (f", {r['character']}" if r.get("character")
                                                                       else "")
            elif r.get("parts"):
                figures = ", ".join(f"{k} {v.split(' (')[0]}" for k, v in r["parts"].items())
            seen = r.get("server_completions")
            if not seen and r.get("client_completions"):  # evalsuite serve writes no access log
                seen = "no access log"
            sent = f"{r.get('client_completions', MISSING)} / {MISSING if seen is None else seen}"
            rows.append([s, f"`{r['command'].removeprefix('evalsuite ')}`", str(r["exit"]), how.replace("|", "/"),
                         figures, sent, f"{r['seconds']:.0f}"])
    return (_source(INTEROP, how="; completions: sent by the client / seen in the server's own log") +
            _table(["server", "command", "exit", "verdict", "figures", "completions", "seconds"], rows))
