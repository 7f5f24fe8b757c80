"""On a TPU host (bash interop/tpu_check.sh installs what it needs): the checks a CPU host cannot run, each in its
own process (one process at a time can hold the chip), summarised in one JSON file.

1. golden: the reference on the chip against the golden files made on a CPU, at float32 matmul precision
   "highest" (the judge's setting) and at the chip's default (bf16 passes: the negative control, which must FAIL);
2. probe: the megakernel compiled by Mosaic for each MINI family and dtype, a few greedy steps beside the
   reference (interop.tpu_probe);
3. diff: `evalsuite diff --engine-option interpret=mosaic` on each family whose probe compiled and ran.

  python -m interop.tpu_check [--chip v5e] [--model NAME ...] [--step golden|probe|diff ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from interop.tpu_probe import FAMILIES

# jax's device_kind -> the generation names engines.megakernel.tpu.CHIPS uses
DEVICE_KINDS = {"TPU v5 lite": "v5e", "TPU v5e": "v5e", "TPU v5": "v5p", "TPU v5p": "v5p", "TPU v6 lite": "v6e",
                "TPU v6e": "v6e", "TPU7x": "v7", "TPU v7": "v7"}
GOLDEN_MODELS = FAMILIES + ("mini-deepseek-mla", "mini-muse")  # every MINI with a golden file
STEP_TIMEOUT_S = 1800  # one command's limit; a MINI's golden check on a v5e took under 30 s


def _run(cmd: list[str], env: dict, log: Path) -> tuple[int, str, float]:
    t0 = time.perf_counter()
    with open(log, "w") as err:
        try:
            p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=err, text=True, timeout=STEP_TIMEOUT_S)
            return p.returncode, p.stdout, time.perf_counter() - t0
        except subprocess.TimeoutExpired as e:
            return 124, e.stdout or "", time.perf_counter() - t0


def golden(models, out: Path, precision: str) -> dict:
    env = dict(os.environ)
    env.pop("JAX_DEFAULT_MATMUL_PRECISION", None)
    if precision == "highest":
        env["JAX_DEFAULT_MATMUL_PRECISION"] = "highest"
    cmd = [sys.executable, "-m", "evalsuite.cli", "golden", "check", "--json"] + [a for m in models
                                                                                 for a in ("--model", m)]
    rc, text, s = _run(cmd, env, out / f"golden-{precision}.log")
    (out / f"golden-{precision}.json").write_text(text)
    rows = {}
    try:
        for m, r in json.loads(text)["models"].items():
            sm = r.get("summary") or {}
            rows[m] = {k: sm.get(k) for k in ("positions", "mismatching_positions", "max_dlogprob", "mean_dlogprob")}
            rows[m]["verdict"] = r["verdict"]
    except (ValueError, KeyError) as e:
        rows["error"] = f"golden check printed no JSON ({e}); see golden-{precision}.log"
    return {"exit": rc, "seconds": round(s, 1), "models": rows}


def probe(models, chip: str, out: Path) -> dict:
    env = dict(os.environ, JAX_DEFAULT_MATMUL_PRECISION="highest")
    cmd = [sys.executable, "-m", "interop.tpu_probe", "--chip", chip, "--out", str(out / "probe.jsonl")]
    rc, _, s = _run(cmd + [a for m in models for a in ("--model", m)], env, out / "probe.log")
    path = out / "probe.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    for r in rows:
        r.pop("traceback", None)  # kept in probe.jsonl
    return {"exit": rc, "seconds": round(s, 1), "rows": rows}


def diffs(models, chip: str, out: Path) -> dict:
    env = dict(os.environ, JAX_DEFAULT_MATMUL_PRECISION="highest")
    res = {}
    for m, dtype in models:
        cmd = [sys.executable, "-m", "evalsuite.cli", "diff", "--model", m, "--dtype", dtype, "--prompts", "quick",
               "--engine-option", "interpret=mosaic", "--engine-option", f"chip={chip}", "--json"]
        rc, text, s = _run(cmd, env, out / f"diff-{m}-{dtype}.log")
        (out / f"diff-{m}-{dtype}.json").write_text(text)
        try:
            d = json.loads(text)
            res[f"{m} {dtype}"] = {"exit": rc, "verdict": d["verdict"], "positions": d.get("positions"),
                                   "real_mismatches": d.get("real_mismatches"), "seconds": round(s, 1)}
        except (ValueError, KeyError):
            res[f"{m} {dtype}"] = {"exit": rc, "verdict": None, "seconds": round(s, 1),
                                   "error": f"see diff-{m}-{dtype}.log"}
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chip", help="the TPU generation (default: the one jax reports)")
    ap.add_argument("--model", action="append", help="a MINI model (repeatable; default: every one)")
    ap.add_argument("--step", action="append", choices=("golden", "probe", "diff"))
    ap.add_argument("--out", default="runs/tpu-check")
    a = ap.parse_args(argv)
    info = device_info()  # in a process of its own: a process that opens the chip holds it until it exits
    if info.get("error"):
        print(f"error: {info['error']}", file=sys.stderr)
        return 2
    if info["backend"] != "tpu":
        print(f"error: jax here runs on {info['backend']}; this check needs a TPU host", file=sys.stderr)
        return 2
    kind = info["device_kind"]
    chip = a.chip or DEVICE_KINDS.get(kind)
    if chip is None:
        print(f"error: unknown TPU {kind!r}; name the generation (v5e, v5p, v6e, v7)", file=sys.stderr)
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    steps = a.step or ["golden", "probe", "diff"]
    summary = {"device_kind": kind, "chip": chip, "devices": info["devices"], "jax": info["jax"],
               "python": platform.python_version(), "steps": steps}
    write = lambda: (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")  # noqa: E731
    if "golden" in steps:
        for precision in ("highest", "default"):
            print(f"tpu_check: golden check of the reference, matmul precision {precision}", flush=True)
            summary[f"golden_{precision}"] = golden(a.model or GOLDEN_MODELS, out, precision)
            write()
    if "probe" in steps:
        print("tpu_check: the megakernel compiled by Mosaic (probe)", flush=True)
        summary["probe"] = probe(a.model or FAMILIES, chip, out)
        write()
    if "diff" in steps:
        ran = [(r["model"], r["dtype"]) for r in summary.get("probe", {}).get("rows", []) if r.get("ok")]
        print(f"tpu_check: diff through Mosaic on {len(ran)} family/dtype pairs that ran", flush=True)
        summary["diff"] = diffs(ran, chip, out)
        write()
    summary["verdict"], summary["why"] = verdict(summary)
    write()
    print(json.dumps(summary, indent=1))
    return {"PASS": 0, "FAIL": 1, "INCONCLUSIVE": 3}[summary["verdict"]]


def device_info() -> dict:
    """jax's backend, device kind and count, and version, asked of a child process (a one-chip host lets one process
    at a time hold the chip, and a parent that had opened it kept every step from starting: "Unable to initialize
    backend 'tpu'", seen on a v5e)."""
    code = ("import json, jax; d = jax.devices(); print(json.dumps({'backend': jax.default_backend(), "
            "'device_kind': d[0].device_kind, 'devices': len(d), 'jax': jax.__version__}))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"jax could not list the devices here: {tail}"}


def verdict(summary: dict) -> tuple[str, list[str]]:
    """PASS only where all three steps ran and each judged something and passed; FAIL where any golden check at full
    precision, probe or diff failed; INCONCLUSIVE (not checked) where a step did not run or judged nothing."""
    golden = summary.get("golden_highest", {}).get("models", {})
    probes = summary.get("probe", {}).get("rows", [])
    diffs = summary.get("diff", {})
    failed = ([f"golden {m}" for m, r in golden.items() if not isinstance(r, dict) or r.get("verdict") != "PASS"]
              + [f"probe {r['model']} {r['dtype']}" for r in probes if not r.get("ok")]
              + [f"diff {k}" for k, r in diffs.items() if r.get("verdict") != "PASS"])
    if failed:
        return "FAIL", failed
    unrun = [step for step, judged in (("golden", golden), ("probe", probes), ("diff", diffs)) if not judged]
    return ("INCONCLUSIVE", [f"not checked: {s}" for s in unrun]) if unrun else ("PASS", [])


if __name__ == "__main__":
    sys.exit(main())
