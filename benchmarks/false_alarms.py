"""False alarms (issue 14): `diff` of the FAITHFUL megakernel against the reference on a large seeded
prompt set (benchmarks/make_prompts.py), in-process and over HTTP (`evalsuite serve` on loopback,
`--engine openai`). Goal: 0 prompts flagged; reported with the rule-of-three 95% upper bound on the
per-prompt false-alarm rate (3/n; with k > 0 flagged, the exact one-sided 97.5% Clopper-Pearson bound),
wall time and peak RSS (of the largest child process so far). A benchmark: prints figures, asserts nothing.

    .venv/bin/python benchmarks/false_alarms.py --n 1000 --dtype float32 --out runs/false-alarms
    .venv/bin/nox -s false_alarms      # 1,000 prompts, float32 and bfloat16, in-process and served
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from make_prompts import main as make_prompts  # noqa: E402

from evalsuite.bench.stats import cp_upper, rule_of_three  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_diff(args: list[str], out: Path) -> dict:
    """One `evalsuite diff` in its own process (its peak RSS is its own), JSON to out."""
    t0 = time.time()
    p = subprocess.run([sys.executable, "-m", "evalsuite.cli", "diff", *args, "--json", "--report", str(out)],
                       capture_output=True, text=True)
    wall = time.time() - t0
    if p.returncode not in (0, 1, 3):
        raise SystemExit(f"error: diff exited {p.returncode}: {p.stderr.strip().splitlines()[-1:]}")
    r = json.loads(p.stdout)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    flagged = [q["id"] for q in r["per_prompt"] if q["real_positions"]]
    return {"verdict": r["verdict"], "prompts": r["prompts"], "skipped": len(r["skipped"]), "flagged": len(flagged),
            "flagged_ids": flagged, "rule_of_three_upper": rule_of_three(r["prompts"]),
            "cp_upper_97_5": cp_upper(len(flagged), r["prompts"]),
            "benign_divergences": r["benign_divergences"], "not_checked": r["not_checked"],
            "wall_s": round(wall, 1), "peak_rss_children_gb": round(usage.ru_maxrss / 2**20, 2)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="false alarms of diff on the faithful megakernel")
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--served", action="store_true", help="also through evalsuite serve on loopback")
    ap.add_argument("--out", default="runs/false-alarms")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    prompts = out / f"prompts-{a.n}-seed{a.seed}.jsonl"
    make_prompts(["--n", str(a.n), "--seed", str(a.seed), "--out", str(prompts)])
    base = ["--model", a.model, "--dtype", a.dtype, "--prompts", str(prompts),
            "--max-new-tokens", str(a.max_new_tokens)]
    rows = {"in-process": _run_diff(base, out / f"inproc-{a.dtype}")}
    print(json.dumps({"in-process": rows["in-process"]}), flush=True)
    if a.served:
        port = _free_port()
        srv = subprocess.Popen([sys.executable, "-m", "evalsuite.cli", "serve", "--engine", "megakernel", "--model",
                                a.model, "--dtype", a.dtype, "--port", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy())
        try:
            url = f"http://127.0.0.1:{port}/v1"
            for _ in range(600):  # the server loads the model first
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    time.sleep(1)
            rows["served"] = _run_diff(base + ["--engine", "openai", "--base-url", url],
                                       out / f"served-{a.dtype}")
            rows["served"]["note"] = "the served engine is the megakernel in --dtype " + a.dtype
        finally:
            srv.terminate()
            srv.wait(timeout=60)
    result = {"model": a.model, "dtype": a.dtype, "n": a.n, "seed": a.seed, "max_new_tokens": a.max_new_tokens,
              "prompt_file": str(prompts), "rows": rows}
    (out / f"false-alarms-{a.dtype}.json").write_text(json.dumps(result, indent=1))
    for k, r in rows.items():
        print(f"{k:10s} {a.dtype}: {r['flagged']} of {r['prompts']} prompts flagged (upper bound on the rate: rule of "
              f"three {r['rule_of_three_upper']:.4f}, exact 97.5% {r['cp_upper_97_5']:.4f}), verdict {r['verdict']}, "
              f"{r['wall_s']} s, peak RSS {r['peak_rss_children_gb']} GB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
