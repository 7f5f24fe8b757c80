"""GSM8K 5-shot throughput: evalsuite's lm-eval adapter on the reference engine vs lm-eval's own
`hf` backend (transformers, torch CPU, the same GGUF in float32), measured in the same run.
Prints figures; asserts nothing.

    bash benchmarks/install_hf.sh            # once: .venv-hf for the hf side
    .venv/bin/python benchmarks/fewshot.py [--items 50] [--batch 32] [--hf-batch 1] [--json]

Both sides run the project's task (tasks/gsm8k/evalsuite_gsm8k.yaml: 5-shot, greedy, max 128
new tokens, stops "Question:", "\\n\\n") on the bundled sample's first N items through
lm_eval.simple_evaluate. Timed: simple_evaluate only (weights loaded before, on both sides; the
reference's jit compilation is inside the cold figure, and a second, warm pass shows it without).
Also shown: the reference with the shared-prefix reuse switched off (every row prefilled in full),
and whether the extracted answers (flexible-extract and strict-match) are identical per item.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
HF_PY = ROOT / ".venv-hf" / "bin" / "python"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from fewshot_hf import _answers  # noqa: E402  (stdlib-only at import: safe in either environment)


def ours(items: int, batch: int) -> dict:
    import lm_eval
    from lm_eval.tasks import TaskManager

    from evalsuite.bench.adapter import ReferenceLM

    lm = ReferenceLM(model="smollm2-135m", batch_size=batch, progress=False)
    tm = TaskManager(include_path=str(ROOT / "tasks" / "gsm8k"), include_defaults=False)

    def once():
        t = time.perf_counter()
        res = lm_eval.simple_evaluate(model=lm, tasks=["evalsuite_gsm8k"], limit=items, log_samples=True,
                                      task_manager=tm, random_seed=0, numpy_random_seed=0, torch_random_seed=0,
                                      fewshot_random_seed=0, verbosity="ERROR")
        return time.perf_counter() - t, _answers(res["samples"]["evalsuite_gsm8k"])

    cold_s, answers = once()
    warm_s, again = once()
    lm.engine.share_prefix = False
    noshare_s, plain = once()
    return {"cold_s": cold_s, "warm_s": warm_s, "no_prefix_reuse_s": noshare_s, "batch": batch,
            "samples": answers, "warm_identical": again == answers, "noshare_samples": plain}


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
    ap.add_argument("--items", type=int, default=50)
    ap.add_argument("--batch", type=int, default=32, help="evalsuite adapter batch_size")
    ap.add_argument("--hf-batch", type=int, default=1, help="hf backend batch_size (lm-eval's default: 1)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    os.chdir(ROOT)
    from evalsuite.registry import smollm2_path
    from evalsuite.versions import versions

    gguf = smollm2_path()
    if not HF_PY.exists():
        sys.exit(f"fewshot.py: {HF_PY} missing: run `bash benchmarks/install_hf.sh` first")
    mine = ours(a.items, a.batch)
    t = time.perf_counter()
    p = subprocess.run([str(HF_PY), str(ROOT / "benchmarks" / "fewshot_hf.py"), str(gguf), "--items", str(a.items),
                        "--batch", str(a.hf_batch)], capture_output=True, text=True)
    if p.returncode:
        last = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}"
        sys.exit(f"fewshot.py: the hf side failed: {last}")
    hf = json.loads(p.stdout)
    per_min = lambda s: a.items / s * 60  # noqa: E731
    res = {
        "items": a.items, "model": "smollm2-135m float32", "versions": versions(), "hf_versions": hf["versions"],
        "evalsuite": {"batch": a.batch, "cold_s": mine["cold_s"], "warm_s": mine["warm_s"],
                      "no_prefix_reuse_s": mine["no_prefix_reuse_s"],
                      "items_per_min_cold": per_min(mine["cold_s"]), "items_per_min_warm": per_min(mine["warm_s"]),
                      "items_per_min_no_prefix_reuse": per_min(mine["no_prefix_reuse_s"]),
                      "warm_pass_identical": mine["warm_identical"]},
        "hf": {"batch": hf["batch"], "load_s": hf["load_s"], "eval_s": hf["eval_s"],
               "items_per_min": per_min(hf["eval_s"]), "torch_threads": hf["torch_threads"],
               "wall_s_with_startup": time.perf_counter() - t},
        "speedup_cold": hf["eval_s"] / mine["cold_s"], "speedup_warm": hf["eval_s"] / mine["warm_s"],
        "vs_hf": compare(mine["samples"], hf["samples"]),
        "prefix_reuse_vs_full_prefill": compare(mine["samples"], mine["noshare_samples"]),
    }
    if a.json:
        print(json.dumps(res, indent=1))
        return
    e, h = res["evalsuite"], res["hf"]
    print(f"GSM8K 5-shot, {a.items} items, smollm2-135m float32, greedy, max 128 new tokens")
    print(f"  evalsuite reference (batch {a.batch}): cold {e['cold_s']:.1f} s = {e['items_per_min_cold']:.1f} items/min"
          f" | warm {e['warm_s']:.1f} s = {e['items_per_min_warm']:.1f} items/min"
          f" | without prefix reuse {e['no_prefix_reuse_s']:.1f} s"
          f" = {e['items_per_min_no_prefix_reuse']:.1f} items/min")
    print(f"  lm-eval hf backend (batch {h['batch']}, torch {hf['versions']['torch']}, {h['torch_threads']} threads):"
          f" {h['eval_s']:.1f} s = {h['items_per_min']:.1f} items/min (model load {h['load_s']:.1f} s, not counted)")
    print(f"  speedup vs hf: cold {res['speedup_cold']:.2f}x, warm {res['speedup_warm']:.2f}x (target >= 3x)")
    for f, c in res["vs_hf"].items():
        diff = f", differ on docs {c['differing_docs']}" if c["differing_docs"] else ""
        print(f"  {f}: extracted answers identical {c['identical_extracted']}/{c['items']}, responses identical "
              f"{c['identical_responses']}/{c['items']}{diff}")
    for f, c in res["prefix_reuse_vs_full_prefill"].items():
        print(f"  prefix reuse vs full prefill, {f}: extracted identical {c['identical_extracted']}/{c['items']}")


if __name__ == "__main__":
    main()
