"""Does the float32 conditioning witness cover a second correct float32 implementation that is not the engine
judged? The witness (evalsuite/compare/witness.py) bounds a flagged float32 position by CONDITIONING_FACTOR times
the judge's own error there (its record against its float64 math, and where flags survive, the worst of that and
4 other reduction orders), on the premise that a correct engine is no further from the judge than that factor
allows. Here the correct engines are transformers' own modelling code in float32 (the committed oracle runs,
tests/engines/oracle/*.json, made in .venv-hf by benchmarks/hf_oracle.py) and the reference's own full-forward
path; the judge is the reference's decode path, as diff's record is. Per position, in the one measure all three
have (the top-5 log-probabilities the oracle recorded, against the reference's float64 math):

    ratio = |subject - judge record| / the witness there   (the witness: the worst of the record and 4 orders)

A position is ill-conditioned where the witness is large; the factor must cover the ratio there. A benchmark:
prints figures, writes JSON, asserts nothing.

    .venv/bin/python -m benchmarks.f32_oracle_witness --out benchmarks/results/f32-oracle-witness.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ORACLE_DIR = Path(__file__).resolve().parents[1] / "tests" / "engines" / "oracle"
TOP_SHARE = 0.1  # the ill-conditioned positions: the tenth with the largest witness, per model


def _top(logits, ids: np.ndarray) -> np.ndarray:
    """Log-probabilities at each position's top-5 ids (the oracle's)."""
    from engines.base import log_softmax

    return np.take_along_axis(log_softmax(np.asarray(logits, np.float64)), ids, -1)


def _full(engine, prompt, tokens, ids) -> np.ndarray:
    """One full forward (Engine.score) over prompt + tokens, at the rows that predict the tokens."""
    logits = engine.score([list(prompt) + list(tokens)])[0].logits
    return _top(logits[len(prompt) - 1:len(prompt) - 1 + len(tokens)], ids)


def _r(x) -> float:
    return float(f"{float(x):.4g}")


def measure(name: str, oracle: dict) -> dict:
    """Per position of every oracle run: the witness, and each subject's distance from the judge's record."""
    from engines.hf_loader import load_hf
    from engines.reference import ReferenceEngine
    from engines.weights import permuted
    from evalsuite.compare.witness import ORDER_SEEDS
    from evalsuite.models import minis_dir

    w = load_hf(minis_dir() / name, name)
    ref = ReferenceEngine(w)
    orders = [ReferenceEngine(permuted(w, s)) for s in ORDER_SEEDS]
    rows = []
    for i, r in enumerate(oracle["runs"]):
        prompt, tokens = r["prompt"], r["tokens"]
        ids = np.asarray([s["top_ids"] for s in r["steps"]], np.int64)  # [n, 5]
        exact = _top(ref.float64_logits(prompt, tokens), ids)
        record = _top(ref.forced_topk([prompt], [tokens], 5, want_logits=True)[0].logits, ids)
        draws = [record] + [_full(e, prompt, tokens, ids) for e in orders]
        witness = np.max([np.abs(d - exact).max(-1) for d in draws], axis=0)
        subjects = {"transformers float32": np.asarray([s["top_logprobs"] for s in r["steps"]], np.float64),
                    "reference full forward": _full(ref, prompt, tokens, ids)}
        for j in range(len(tokens)):  # 4 significant digits: the file keeps every position
            rows.append({"run": i, "position": j, "witness": _r(witness[j]),
                         "record_from_exact": _r(np.abs(record[j] - exact[j]).max()),
                         **{f"{k}: from exact": _r(np.abs(v[j] - exact[j]).max()) for k, v in subjects.items()},
                         **{f"{k}: from record": _r(np.abs(v[j] - record[j]).max()) for k, v in subjects.items()}})
    return {"model": name, "weights_sha256": w.sha256, "positions": rows}


def summarise(m: dict) -> dict:
    rows = m["positions"]
    wit = np.asarray([r["witness"] for r in rows])
    top = np.argsort(wit)[::-1][:max(1, int(np.ceil(TOP_SHARE * len(rows))))]
    out = {"positions": len(rows), "witness_max": float(wit.max()), "witness_median": float(np.median(wit))}
    for s in ("transformers float32", "reference full forward"):
        ratio = np.asarray([r[f"{s}: from record"] for r in rows]) / np.maximum(wit, 1e-30)
        out[s] = {"ratio_max": float(ratio.max()), "ratio_max_ill_conditioned": float(ratio[top].max()),
                  "ratio_median": float(np.median(ratio)),
                  "from_exact_max": float(max(r[f"{s}: from exact"] for r in rows))}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="the float32 witness against transformers' float32 (the oracle runs)")
    ap.add_argument("--models", default="", help="comma-separated oracle names (default: every committed oracle)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if a.out and not Path(a.out).parent.is_dir():
        print(f"error: --out {a.out}: no directory {Path(a.out).parent}", file=sys.stderr)
        return 2
    have = {p.stem: p for p in sorted(ORACLE_DIR.glob("*.json"))}
    names = [s for s in a.models.split(",") if s] or list(have)
    if unknown := [s for s in names if s not in have]:
        print(f"error: --models: no committed oracle for {', '.join(unknown)} (have: {', '.join(have)})",
              file=sys.stderr)
        return 2
    from evalsuite.versions import versions

    t0, results = time.time(), []
    for name in names:
        t = time.time()
        m = measure(name, json.loads(have[name].read_text()))
        m["summary"] = summarise(m)
        results.append(m)
        s = m["summary"]
        print(f"{name}: {s['positions']} positions, witness max {s['witness_max']:.2e} (median "
              f"{s['witness_median']:.1e}); ratio to the witness, max (ill-conditioned tenth): "
              + "; ".join(f"{k} {s[k]['ratio_max']:.2f} ({s[k]['ratio_max_ill_conditioned']:.2f})"
                          for k in ("transformers float32", "reference full forward"))
              + f" [{time.time() - t:.0f} s]", flush=True)
        if a.out:  # written after every model, so a killed run keeps what it measured
            doc = {"benchmark": "f32_oracle_witness", "measure": "max |Δ top-5 log-probability| at the oracle's "
                   "top-5 ids, against the reference's float64 math", "judge": "the reference's decode path "
                   "(forced_topk), as diff's record", "top_share": TOP_SHARE, "models": results,
                   "seconds": round(time.time() - t0, 1), "versions": versions()}
            Path(a.out).write_text(json.dumps(doc) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
