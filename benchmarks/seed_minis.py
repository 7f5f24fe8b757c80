"""The seed families' MINI models through the megakernel (issue 42's acceptance matrix): `evalsuite diff` and
`evalsuite golden check` on each model, in float32 and bfloat16, in the generic interpreter and in TPU interpret
mode (DMAs executed eagerly, the race detector on: a race FAILs both commands).

    .venv/bin/python -m benchmarks.seed_minis --out benchmarks/results/seed-minis.json [--jobs 4]

A benchmark, not a test: each run is its own CLI process (as a user runs it), several at once with --jobs; the JSON
holds each run's verdict and headline figures, and is rewritten after every run (--resume keeps the finished ones).
`python -m evalsuite.docgen` turns it into docs/megakernel.md's table.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from evalsuite.versions import commit, versions

# one MINI per seed family: Kimi K3 (KDA, NoPE MLA with its gate, latent MoE, attention residuals), Qwen3.8's Gated
# DeltaNet hybrid and its twin with a near-dead key head (the L2 norm's epsilon shows there), Muse Spark (NoPE and
# sliding layers, gated residuals, its latent MoE); and Kimi Linear (KDA + MLA)
MODELS = ("mini-kimi", "mini-qwen-hybrid", "mini-qwen-lownorm", "mini-muse", "mini-kimi-linear")
DTYPES = ("float32", "bfloat16")
MODES = ("generic", "tpu")
COMMANDS = ("diff", "golden")
# diff's prompts and tokens by dtype. float32: the 12 quick prompts x 32 tokens. bfloat16: the 36 built-in ones x 16
# (576 teacher-forced positions, past the 256 bf16's drift check needs): on mini-kimi and mini-muse the bf16 tokens
# leave the reference's within a few steps (their recipes are 10-16 logits from float32), so the batching part's
# staggered stops, which end a row where its tokens equal the reference's first 4..N, never fired at 32 tokens on
# the quick set (diff: INCONCLUSIVE, the stop path not driven); shorter stops over more prompts drive it
DIFF_SETTINGS = {"float32": ("quick", 32), "bfloat16": ("builtin", 16)}


def argv(command: str, model: str, dtype: str, mode: str, extra: tuple[str, ...] = ()) -> list[str]:
    """The CLI arguments of one run; extra: more --engine-option KEY=VALUE settings (e.g. rounds=public)."""
    opts = ["--engine", "megakernel", "--dtype", dtype, "--engine-option", f"interpret={mode}",
            *[a for kv in extra for a in ("--engine-option", kv)], "--json"]
    if command == "diff":
        prompts, n = DIFF_SETTINGS[dtype]
        return ["diff", "--model", model, "--prompts", prompts, "--max-new-tokens", str(n), *opts]
    return ["golden", "check", "--model", model, *opts]


def headline(command: str, r: dict) -> dict:
    """The figures a row shows, from the command's JSON."""
    if command == "diff":
        return {"verdict": r["verdict"], "positions": r["positions"], "real": r["real_mismatches"],
                "identical": r["prompts_identical"], "prompts": r["prompts"],
                "max_dlogprob": (r.get("summary") or {}).get("max_dlogprob", {}).get("max"),
                "not_checked": r["not_checked"], "self_checks": r.get("engine_self_checks", [])}
    res = next(iter(r["models"].values()))  # one model a run
    s = res.get("summary") or {}
    return {"verdict": res["verdict"], "positions": s.get("positions"), "real": s.get("mismatching_positions"),
            "max_dlogprob": s.get("max_dlogprob"), "not_checked": res.get("not_checked", []),
            "problems": res.get("problems", []), "self_checks": s.get("engine_self_checks", [])}


def key(row: dict) -> tuple[str, str, str, str]:
    return row["command"], row["model"], row["dtype"], row["interpret"]


def run_one(k: tuple[str, str, str, str], extra: tuple[str, ...] = ()) -> dict:
    command, model, dtype, mode = k
    t0 = time.time()
    p = subprocess.run([sys.executable, "-m", "evalsuite.cli", *argv(command, model, dtype, mode, extra)],
                       capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    row = {"command": command, "model": model, "dtype": dtype, "interpret": mode, "exit": p.returncode,
           "seconds": round(time.time() - t0, 1), "argv": argv(command, model, dtype, mode, extra),
           "commit": commit(Path(__file__).parent), "versions": versions(),
           "where": f"{os.cpu_count()} CPUs (JAX_PLATFORMS={os.environ.get('JAX_PLATFORMS', '')})"}
    try:
        return row | headline(command, json.loads(p.stdout))
    except (json.JSONDecodeError, KeyError, IndexError):
        tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
        return row | {"verdict": "ERROR", "error": tail}


def main(argv_: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="the seed MINI models through the megakernel: diff and golden check")
    ap.add_argument("--out", required=True)
    ap.add_argument("--jobs", type=int, default=1, help="runs at once (each a CLI process)")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--commands", default=",".join(COMMANDS), help="diff, golden, or both (in this order)")
    ap.add_argument("--resume", action="store_true", help="keep the rows already in --out and run the others")
    ap.add_argument("--engine-option", action="append", default=[], metavar="KEY=VALUE",
                    help="passed to every run (e.g. rounds=public: the public kernels' bf16 rounding points)")
    a = ap.parse_args(argv_)
    out = Path(a.out)
    prev = json.loads(out.read_text()) if a.resume and out.exists() else {"rows": []}
    # a kept row keeps the commit and versions it ran at (the head says this invocation's)
    rows = [{"commit": prev.get("commit"), "versions": prev.get("versions")} | r for r in prev["rows"]]
    extra = tuple(a.engine_option)
    rows = [r for r in rows if r["verdict"] != "ERROR" and r.get("argv") == argv(*key(r), extra)]  # same settings
    done = {key(r) for r in rows}
    keys = [k for k in itertools.product(a.commands.split(","), a.models.split(","), a.dtypes.split(","),
                                         a.modes.split(","))
            if k not in done]
    head = {"benchmark": "seed-minis", "command": "python -m benchmarks.seed_minis " + " ".join(argv_ or sys.argv[1:]),
            "diff_settings": DIFF_SETTINGS, "engine_options": list(extra), "commit": commit(Path(__file__).parent),
            "versions": versions()}
    with ThreadPoolExecutor(max(1, a.jobs)) as pool:
        for done_ in as_completed([pool.submit(run_one, k, extra) for k in keys]):
            row = done_.result()
            rows.append(row)
            print(f"{row['command']} {row['model']} {row['dtype']} {row['interpret']}: {row['verdict']} "
                  f"({row['seconds']} s)", flush=True)
            out.write_text(json.dumps(head | {"rows": rows}, indent=1) + "\n")
    bad = [r for r in rows if r["verdict"] != "PASS"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
