"""One prompt of the false-alarm set against a float64 witness: the independent numpy transcription of
smollm2-135m (tests/engines/reference/test_smollm2_independent.py) run with its weights cast to float64,
teacher-forced along the float32 reference's greedy tokens. Prints, per comparison, max |Δlogit| at the
first generated position and over the rest: how far each float32 engine is from exact arithmetic there,
and from each other. A benchmark: prints figures, asserts nothing.

    .venv/bin/python -m benchmarks.f64_witness gen-0170-raw-repetition [--prompts FILE] [--tokens 32]

--prompts: benchmarks/make_prompts.py's output (default: the false-alarm run's 1,000 prompts, seed 0).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="a prompt's float32 engines against a float64 witness")
    ap.add_argument("prompt_id")
    ap.add_argument("--prompts", default="runs/false-alarms/prompts-1000-seed0.jsonl")
    ap.add_argument("--tokens", type=int, default=32)
    a = ap.parse_args(argv)
    path = Path(a.prompts)
    if not path.is_file():
        print(f"error: {path} not found (.venv/bin/python -m benchmarks.make_prompts --n 1000 --seed 0 --out {path})",
              file=sys.stderr)
        return 2
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    hit = [r for r in rows if r.get("id") == a.prompt_id]
    if not hit:
        print(f"error: no prompt {a.prompt_id!r} in {path}", file=sys.stderr)
        return 2

    from engines.megakernel import MegakernelEngine
    from engines.reference import ReferenceEngine
    from evalsuite.models import load_model, smollm2_path
    from tests.engines.reference.test_smollm2_independent import numpy_logits, numpy_model

    m = load_model("smollm2-135m")
    r = hit[0]
    prompt = m.tokenizer.encode_chat(r["text"]) if r.get("kind") == "chat" else m.tokenizer.encode(r["text"])
    ref, mk = ReferenceEngine(m.weights, "float32"), MegakernelEngine(m.weights, "float32")
    gen = ref.generate([prompt], a.tokens, want_logits=True)[0]
    toks = gen.token_ids
    ref_forced = ref.forced_topk([prompt], [toks], 5, want_logits=True)[0].logits
    mk_forced = mk.forced_topk([prompt], [toks], 5, want_logits=True)[0].logits
    t, cfg = numpy_model(smollm2_path())
    t = {k: v.astype(np.float64) for k, v in t.items()}
    f64 = numpy_logits(t, cfg, list(prompt) + list(toks[:-1]))[len(prompt) - 1:]
    print(f"{a.prompt_id}: {len(prompt)} prompt tokens, {len(toks)} generated; max |logit| at the first: "
          f"{np.abs(f64[0]).max():.1f}")
    jax64 = ref.float64_logits(prompt, toks)  # diff's conditioning witness: the reference's own math in float64
    for name, x, y in (("witness (jax float64) vs numpy float64", jax64, f64),
                       ("reference (generate) vs float64", gen.logits, f64), ("reference (forced) vs float64",
                       ref_forced, f64), ("megakernel (forced) vs float64", mk_forced, f64),
                       ("megakernel vs reference (generate)", mk_forced, gen.logits)):
        d = np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)).max(-1)
        print(f"  {name:36s} first {d[0]:.2e}   rest max {d[1:].max():.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
