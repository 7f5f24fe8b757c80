"""GSM8K 5-shot throughput: evalsuite's lm-eval adapter on the reference engine vs lm-eval's own
`hf` backend (transformers, torch CPU, the same GGUF in float32), on the same items in the same run.
Prints figures; asserts nothing.

    bash benchmarks/install_hf.sh            # once: .venv-hf for the hf side
    .venv/bin/python -m benchmarks.fewshot [--data ../shared/data] [--items 50] [--batch 32] [--hf-batch 1] [--json]

Both sides run `evalsuite_gsm8k` (lm-eval 0.4.13's `gsm8k`: 5 exemplars per item drawn from the train
split with few-shot seed 1234, greedy, 256 new tokens at most, stops "Question:", "</s>", "<|im_end|>")
on the first N items of the data `evalsuite run gsm8k --data` would use (default: ../shared/data when
present, else the bundled sample), through lm_eval.simple_evaluate with the seeds `evalsuite run` uses.
Timed: simple_evaluate only (weights loaded before, on both sides). evalsuite is timed three ways, each
its own process where it says so:
  cold, empty cache   a fresh process with an empty jax compilation cache (a first run ever);
  cold, cache filled  a fresh process reusing that cache (every later run of a user);
  warm                a second pass in the second process (nothing left to compile).
Also: whether the extracted answers (strict-match and flexible-extract) and the responses are
identical per item between the two backends.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.fewshot_hf import answers  # stdlib-only at import: safe in either environment

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
HF_PY = ROOT / ".venv-hf" / "bin" / "python"
SHARED = ROOT.parent / "shared" / "data"
TASK = "evalsuite_gsm8k"


def ours(tasks_dir: str, items: int, batch: int, passes: int) -> dict:
    """One process of evalsuite's side: `passes` timed simple_evaluate calls."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    from evalsuite.bench.adapter import EngineLM
    from evalsuite.bench.run import LM_EVAL_RANDOM_SEED, LM_EVAL_SEED

    lm = EngineLM(engine="reference", model="smollm2-135m", batch_size=batch, progress=False)
    tm = TaskManager(include_path=tasks_dir, include_defaults=False)
    out = []
    for _ in range(passes):
        t = time.perf_counter()
        res = lm_eval.simple_evaluate(model=lm, tasks=[TASK], limit=items, log_samples=True, task_manager=tm,
                                      random_seed=LM_EVAL_RANDOM_SEED, numpy_random_seed=LM_EVAL_SEED,
                                      torch_random_seed=LM_EVAL_SEED, fewshot_random_seed=LM_EVAL_SEED,
                                      verbosity="ERROR")
        out.append({"s": time.perf_counter() - t, "samples": answers(res["samples"][TASK])})
    return {"passes": out}


def _failed(p: subprocess.CompletedProcess, side: str) -> None:
    """Exit in one line (the subprocess's last stderr line) when a side's process failed."""
    if p.returncode:
        last = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}"
        sys.exit(f"fewshot.py: {side} failed: {last}")


def ours_process(tasks_dir: Path, items: int, batch: int, passes: int, cache: Path) -> dict:
    env = dict(os.environ, EVALSUITE_COMPILE_CACHE=str(cache))
    p = subprocess.run([sys.executable, "-m", "benchmarks.fewshot", "--side", "ours", "--tasks-dir", str(tasks_dir),
                        "--items", str(items), "--batch", str(batch), "--passes", str(passes)],
                       capture_output=True, text=True, env=env, cwd=ROOT)
    _failed(p, "evalsuite's side")
    return json.loads(p.stdout.strip().splitlines()[-1])


def compare(a: dict, b: dict) -> dict:
    out = {}
    for f in a:
        ids = sorted(a[f], key=int)
        other = {i: b.get(f, {}).get(i, [None, None]) for i in ids}
        out[f] = {"identical_extracted": sum(a[f][i][0] == other[i][0] for i in ids),
                  "identical_responses": sum(a[f][i][1] == other[i][1] for i in ids),
                  "items": len(ids), "differing_docs": [i for i in ids if a[f][i][0] != other[i][0]]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=None, help="bundled, or a folder (default: ../shared/data if present)")
    ap.add_argument("--items", type=int, default=50)
    ap.add_argument("--batch", type=int, default=32, help="evalsuite adapter batch_size")
    ap.add_argument("--hf-batch", type=int, default=1, help="hf backend batch_size (lm-eval's default: 1)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--side", choices=["ours"], help=argparse.SUPPRESS)
    ap.add_argument("--tasks-dir", help=argparse.SUPPRESS)
    ap.add_argument("--passes", type=int, default=1, help=argparse.SUPPRESS)
    a = ap.parse_args()
    os.chdir(ROOT)
    if a.side == "ours":
        print(json.dumps(ours(a.tasks_dir, a.items, a.batch, a.passes)))
        return
    from evalsuite.bench.data import resolve
    from evalsuite.bench.run import LM_EVAL_RANDOM_SEED, LM_EVAL_SEED, resolve_tasks
    from evalsuite.errors import SpecError
    from evalsuite.models import smollm2_path
    from evalsuite.versions import versions

    if not HF_PY.exists():
        sys.exit(f"fewshot.py: {HF_PY} missing: run `bash benchmarks/install_hf.sh` first")
    data = a.data or (str(SHARED) if SHARED.is_dir() else "bundled")
    work = Path(tempfile.mkdtemp(prefix="evalsuite-fewshot-"))
    try:
        src = resolve("gsm8k", data)
        tasks_dir = resolve_tasks("gsm8k", src, work)
    except SpecError as e:
        sys.exit(f"fewshot.py: {e}")
    cache = work / "jax-cache"
    cold = ours_process(tasks_dir, a.items, a.batch, 1, cache)["passes"][0]
    filled = ours_process(tasks_dir, a.items, a.batch, 2, cache)["passes"]
    t = time.perf_counter()
    p = subprocess.run([str(HF_PY), str(ROOT / "benchmarks" / "fewshot_hf.py"), str(smollm2_path()), "--items",
                        str(a.items), "--batch", str(a.hf_batch), "--tasks-dir", str(tasks_dir),
                        "--seed", str(LM_EVAL_SEED), "--random-seed", str(LM_EVAL_RANDOM_SEED)],
                       capture_output=True, text=True)
    _failed(p, "the hf side")
    hf = json.loads(p.stdout)
    per_min = lambda s: a.items / s * 60  # noqa: E731
    times = {"cold_empty_cache_s": cold["s"], "cold_cache_filled_s": filled[0]["s"], "warm_s": filled[1]["s"]}
    res = {
        "items": a.items, "model": "smollm2-135m float32", "task": TASK, "seed": LM_EVAL_SEED,
        "random_seed": LM_EVAL_RANDOM_SEED,
        "data": {"source": src.source, "origin": src.origin, "path": str(src.path), "fewshot": str(src.fewshot)},
        "versions": versions(), "hf_versions": hf["versions"],
        "evalsuite": {"batch": a.batch, **times, **{k.replace("_s", "_items_per_min"): per_min(v)
                                                     for k, v in times.items()},
                      "passes_identical": cold["samples"] == filled[0]["samples"] == filled[1]["samples"]},
        "hf": {"batch": hf["batch"], "load_s": hf["load_s"], "eval_s": hf["eval_s"],
               "items_per_min": per_min(hf["eval_s"]), "torch_threads": hf["torch_threads"],
               "wall_s_with_startup": time.perf_counter() - t},
        "speedup": {k.replace("_s", ""): hf["eval_s"] / v for k, v in times.items()},
        "vs_hf": compare(cold["samples"], hf["samples"]),
    }
    if a.json:
        print(json.dumps(res, indent=1))
        return
    e, h, s = res["evalsuite"], res["hf"], res["speedup"]
    print(f"GSM8K 5-shot ({TASK} = lm-eval's gsm8k), first {a.items} items of {src.origin} ({src.source}), "
          "smollm2-135m float32, greedy, max 256 new tokens")
    for k, label in (("cold_empty_cache", "cold, empty compile cache"), ("cold_cache_filled", "cold, cache filled"),
                     ("warm", "warm")):
        print(f"  evalsuite reference (batch {a.batch}), {label:26s} {e[k + '_s']:7.1f} s = "
              f"{e[k + '_items_per_min']:6.1f} items/min   {s[k]:5.2f}x hf")
    print(f"  lm-eval hf backend (batch {h['batch']}, torch {hf['versions']['torch']}, {h['torch_threads']} threads):"
          f" {h['eval_s']:.1f} s = {h['items_per_min']:.1f} items/min (model load {h['load_s']:.1f} s, not counted)")
    print(f"  evalsuite's three passes identical: {e['passes_identical']}  (target: >= 5x hf cold)")
    for f, c in res["vs_hf"].items():
        diff = f", differ on docs {c['differing_docs']}" if c["differing_docs"] else ""
        print(f"  {f}: extracted answers identical {c['identical_extracted']}/{c['items']}, responses identical "
              f"{c['identical_responses']}/{c['items']}{diff}")


if __name__ == "__main__":
    main()
