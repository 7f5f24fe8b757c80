"""The peer side of benchmarks/fewshot.py, run in .venv-hf (torch + transformers): lm-eval's own
`hf` backend loading the SmolLM2 GGUF in float32 on the CPU. Prints one JSON object.

    .venv-hf/bin/python benchmarks/fewshot_hf.py GGUF_PATH --tasks-dir DIR --items 50 [--batch 1]

DIR: the task folder fewshot.py prepared (evalsuite_gsm8k pointed at the chosen data); fewshot.py
passes the seeds `evalsuite run` uses (--seed: few-shot, numpy, torch; --random-seed: python's).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("--items", type=int, default=50)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--tasks-dir", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--random-seed", type=int, required=True)
    a = ap.parse_args()
    os.chdir(ROOT)
    import lm_eval
    import torch
    import transformers
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    gguf = Path(a.gguf)
    t = time.perf_counter()
    lm = HFLM(pretrained=str(gguf.parent), gguf_file=gguf.name, dtype="float32", device="cpu",
              batch_size=a.batch, max_length=2048)
    load_s = time.perf_counter() - t
    t = time.perf_counter()
    res = lm_eval.simple_evaluate(model=lm, tasks=["evalsuite_gsm8k"], limit=a.items, log_samples=True,
                                  task_manager=TaskManager(include_path=a.tasks_dir, include_defaults=False),
                                  random_seed=a.random_seed, numpy_random_seed=a.seed, torch_random_seed=a.seed,
                                  fewshot_random_seed=a.seed)
    eval_s = time.perf_counter() - t
    json.dump({"load_s": load_s, "eval_s": eval_s, "batch": a.batch, "torch_threads": torch.get_num_threads(),
               "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                            "lm_eval": lm_eval.__version__ if hasattr(lm_eval, "__version__") else "?"},
               "samples": answers(res["samples"]["evalsuite_gsm8k"])}, sys.stdout)


def answers(samples) -> dict:
    """filter -> doc_id -> (extracted answer, raw response)."""
    out: dict = {}
    for s in samples:
        out.setdefault(s["filter"], {})[str(s["doc_id"])] = [s["filtered_resps"][0], s["resps"][0][0]]
    return out


if __name__ == "__main__":
    main()
