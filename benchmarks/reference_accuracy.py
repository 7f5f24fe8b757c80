"""One engine's accuracy on a benchmark, alone (no second engine, no paired verdict): for a model only the
reference implements (qwen2.5-coder-0.5b: the megakernel has no Qwen2 biases). Prints figures, asserts nothing.

    .venv/bin/python -m benchmarks.reference_accuracy --model qwen2.5-coder-0.5b --task gsm8k \\
        --data ../shared/data --limit 100 [--variant 5shot] [--output runs/acc-qwen]

The same lm-eval task, data, seeds and journal as `evalsuite run` (evalsuite.bench.run), so the run resumes
from its journal and its records sit in OUTPUT/reference/. Reports accuracy with its Wilson 95% interval (both
of the task's filters), the data file's sha256, the weights' sha256, wall time and peak RSS, and writes them
to OUTPUT/accuracy.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import sys
import time
from pathlib import Path

from evalsuite.bench import stats
from evalsuite.bench.data import check_rows, load_rows, resolve
from evalsuite.bench.run import DEFAULT_VARIANT, LM_EVAL_SEED, RunSpec, resolve_tasks, run_engine
from evalsuite.models import load_model
from evalsuite.versions import versions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--task", default="gsm8k")
    ap.add_argument("--variant", default=None)
    ap.add_argument("--data", default=None, help="a folder in the hub schema (e.g. ../shared/data); default bundled")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--output", default=None)
    ap.add_argument("--engine", default="reference")
    a = ap.parse_args()
    variant = a.variant or DEFAULT_VARIANT[a.task]
    out = Path(a.output or f"runs/accuracy-{a.model}-{a.task}-{variant}")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    src = resolve(a.task, a.data)
    rows = load_rows(src.path)
    check_rows(a.task, src.path, rows)
    spec = RunSpec(task=a.task, variant=variant, engine=a.engine, model=a.model, limit=a.limit,
                   data_dir=a.data, output=str(out), seed=LM_EVAL_SEED)
    model = load_model(a.model)
    tasks = resolve_tasks(a.task, src, out)
    res = run_engine(spec, a.engine, "float32", None, tasks, out,
                     lambda s: print(f"[{time.strftime('%H:%M:%S')}] {s}", file=sys.stderr, flush=True))
    recs = res["records"]
    n = len(recs)
    by_filter = {}
    for key in sorted(k for k in recs[0] if k.startswith("correct_")):
        k = sum(r[key] for r in recs)
        lo, hi = stats.wilson_ci(k, n)
        by_filter[key[len("correct_"):]] = {"correct": k, "accuracy": k / n, "wilson95": [lo, hi]}
    fig = {"model": a.model, "engine": a.engine, "task": a.task, "variant": variant, "items": n,
           "data": {"source": "bundled" if src.bundled else str(src.path),
                    "sha256": hashlib.sha256(Path(src.path).read_bytes()).hexdigest(), "rows": len(rows)},
           "weights_sha256": model.weights.sha256, "by_filter": by_filter, "primary_filter": res["primary_filter"],
           "seconds": round(time.time() - t0, 1),
           "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 2),
           "seed": LM_EVAL_SEED, "versions": versions()}
    (out / "accuracy.json").write_text(json.dumps(fig, indent=1) + "\n")
    print(f"{a.model} ({a.engine}) on {a.task}/{variant}, {n} items of {len(rows)}:")
    for f, v in by_filter.items():
        print(f"  {f}: {v['correct']}/{n} = {v['accuracy']:.3f} (Wilson 95% {v['wilson95'][0]:.3f}-"
              f"{v['wilson95'][1]:.3f})")
    print(f"  {fig['seconds']} s, peak RSS {fig['peak_rss_gb']} GB; {out / 'accuracy.json'}")


if __name__ == "__main__":
    main()
