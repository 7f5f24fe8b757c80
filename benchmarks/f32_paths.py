"""A position a faithful engine's float32 diff flagged, measured on every path: how far each way of running the
reference, and each way of running the megakernel, is from the reference's own float64 math there. It asks
whether the conditioning witness (evalsuite/compare/witness.py) samples the spread a correct float32 engine has:
the witness bounds a flagged position by CONDITIONING_FACTOR times the judge's worst draw, on the premise that a
correct engine is no further from exact than the judge. A benchmark: prints figures, writes JSON, asserts nothing.

    .venv/bin/python -m benchmarks.f32_paths --model mini-kimi --prompt gen-0784-chat --position 8 \
        --out benchmarks/results/f32-paths-mini-kimi.json

The prompt is found in benchmarks/detection.py's seeded order (the false-alarm rows' 64 prompts, seed 0); its
batch there is the chunk of 8 it ran in. Paths, each teacher-forced along the float32 reference's greedy tokens
unless named otherwise: the reference's record (generate, in the chunk); forced in the chunk, alone, among 8
copies of itself, among COMPANION_SEEDS' seeded companions from the other prompts; the reference's full
forward (score, alone) and the same in the witness's other reduction orders (witness.ORDER_SEEDS); the megakernel
forced in the chunk, alone, among copies, among the same companions.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

COMPANION_SEEDS = (11, 12, 13)  # each: 7 other prompts of the 64 and the flagged prompt's row, drawn by this seed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="a flagged float32 position on every path, against float64")
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt", required=True, help="a prompt id of the detection order (e.g. gen-0784-chat)")
    ap.add_argument("--position", type=int, required=True, help="the flagged position (0-based generated token)")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--out", default=None)
    ap.add_argument("--dump-sequence", default=None, metavar="JSON",
                    help="write the prompt and the reference's tokens there (for benchmarks/hf_logits.py) and stop")
    ap.add_argument("--peer", action="append", default=[], metavar="NAME=NPZ",
                    help="another float32 implementation's logits along the same sequence (benchmarks/hf_logits.py's "
                         "output), measured as one more row")
    a = ap.parse_args(argv)
    if a.out and not Path(a.out).parent.is_dir():
        print(f"error: --out {a.out}: no directory {Path(a.out).parent}", file=sys.stderr)
        return 2
    if not 0 <= a.position < a.tokens:
        print(f"error: --position {a.position}: expected 0..{a.tokens - 1}", file=sys.stderr)
        return 2

    from benchmarks.detection import CHUNK, prompt_order
    from engines.errors import ModelError
    from engines.megakernel import MegakernelEngine
    from engines.reference import ReferenceEngine
    from evalsuite.compare import metrics
    from evalsuite.compare.witness import ORDER_SEEDS
    from evalsuite.models import load_model
    from evalsuite.plugins import judge
    from evalsuite.versions import versions

    try:
        m = load_model(a.model)
    except ModelError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    ps = prompt_order(m.tokenizer, 64, 0, m.config.max_context, a.tokens)
    ids = [i for i, _ in ps]
    if a.prompt not in ids:
        print(f"error: --prompt {a.prompt}: not among the 64 prompts of {a.model}'s detection order", file=sys.stderr)
        return 2
    at = ids.index(a.prompt)
    lo = at - at % CHUNK
    chunk, k = [p for _, p in ps[lo:lo + CHUNK]], at - lo
    others = [p for i, (_, p) in enumerate(ps) if not lo <= i < lo + CHUNK]
    ref = ReferenceEngine(m.weights, "float32")
    g = ref.generate(chunk, a.tokens, top_k=5, want_logits=True)
    toks = [x.token_ids for x in g]
    P, T, j = chunk[k], toks[k], a.position
    if j >= len(T):
        print(f"error: --position {j}: the reference stopped after {len(T)} tokens", file=sys.stderr)
        return 2
    if a.dump_sequence:
        Path(a.dump_sequence).write_text(json.dumps({"model": a.model, "prompt_id": a.prompt, "prompt": list(P),
                                                     "tokens": list(T)}))
        print(f"wrote {a.dump_sequence}")
        return 0
    peers = []
    for spec in a.peer:
        name, _, path = spec.partition("=")
        try:
            peers.append((name, np.load(path)["logits"]))
        except (OSError, ValueError, KeyError) as e:
            print(f"error: --peer {spec}: {e}", file=sys.stderr)
            return 2
        if peers[-1][1].shape[0] != len(T):
            print(f"error: --peer {spec}: {peers[-1][1].shape[0]} positions, the reference has {len(T)}",
                  file=sys.stderr)
            return 2
    exact = np.asarray(ref.float64_logits(P, T), np.float64)
    rows: list[dict] = []

    record = np.asarray(g[k].logits, np.float64)

    def measure(who: str, path: str, logits) -> None:
        x = np.asarray(logits, np.float64)
        dl, kl = np.abs(x - exact).max(-1), metrics.kl(exact, x)
        rows.append({"engine": who, "path": path, "dlogit": float(dl[j]), "kl": float(kl[j]),
                     "median_dlogit": float(np.median(dl)),  # and what diff's rule sees: the distance from the record
                     "from_record_dlogit": float(np.abs(x[j] - record[j]).max()),
                     "from_record_kl": float(metrics.kl(record[j:j + 1], x[j:j + 1])[0])})
        print(f"{who:10s} {path:26s} |Δlogit| {dl[j]:.3g}  KL {kl[j]:.3g}  (prompt's median |Δlogit| "
              f"{np.median(dl):.2g})", flush=True)

    companions = []
    for s in COMPANION_SEEDS:
        r = random.Random(s)
        comp, row = r.sample(others, CHUNK - 1), r.randrange(CHUNK)
        ct = [x.token_ids for x in ref.generate(comp, a.tokens)]
        companions.append((s, comp[:row] + [P] + comp[row:], ct[:row] + [T] + ct[row:], row))
    t0 = time.time()
    measure("reference", "record (generate, chunk)", g[k].logits)
    for who, eng in (("reference", ref), ("megakernel", MegakernelEngine(m.weights, "float32"))):
        measure(who, "forced, chunk", eng.forced_topk(chunk, toks, 5, want_logits=True)[k].logits)
        measure(who, "forced, alone", eng.forced_topk([P], [T], 5, want_logits=True)[0].logits)
        measure(who, f"forced, {CHUNK} copies", eng.forced_topk([P] * CHUNK, [T] * CHUNK, 5,
                                                               want_logits=True)[0].logits)
        for s, batch, conts, row in companions:
            measure(who, f"forced, companions {s}", eng.forced_topk(batch, conts, 5, want_logits=True)[row].logits)
    seq, span = list(P) + list(T), slice(len(P) - 1, len(P) - 1 + len(T))
    measure("reference", "score, alone", ref.score([seq])[0].logits[span])
    for s in ORDER_SEEDS:
        measure("reference", f"score, order {s}", judge(m, "float32", order_seed=s).score([seq])[0].logits[span])
    for name, logits in peers:
        measure(name, "full forward, alone", logits)
    who_all = list(dict.fromkeys(r["engine"] for r in rows))
    worst = {w: max(r["dlogit"] for r in rows if r["engine"] == w) for w in who_all}
    worst_kl = {w: max(r["kl"] for r in rows if r["engine"] == w) for w in who_all}
    # the witness diff applies where flags survive its float64 one: the worst of the record and the 4 orders
    wit = [r for r in rows if r["path"].startswith(("record", "score, order"))]
    witness = {"dlogit": max(r["dlogit"] for r in wit), "kl": max(r["kl"] for r in wit)}
    print(f"worst: reference {worst['reference']:.3g} (KL {worst_kl['reference']:.3g}), megakernel "
          f"{worst['megakernel']:.3g} (KL {worst_kl['megakernel']:.3g}): ratio "
          f"{worst['megakernel'] / worst['reference']:.2f} in |Δlogit|")
    if a.out:
        Path(a.out).write_text(json.dumps({
            "benchmark": "f32_paths", "model": a.model, "weights_sha256": m.weights.sha256, "prompt": a.prompt,
            "position": j, "tokens": a.tokens, "order": "benchmarks/detection.py prompt_order (64 prompts, seed 0)",
            "companion_seeds": list(COMPANION_SEEDS), "rows": rows, "worst_dlogit": worst, "worst_kl": worst_kl,
            "witness": witness, "peers": [n for n, _ in peers],
            "seconds": round(time.time() - t0, 1), "versions": versions()}, indent=1))
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
