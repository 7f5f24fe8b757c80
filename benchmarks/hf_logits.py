"""transformers' own float32 logits for given sequences of a mini checkpoint: a second correct float32
implementation, not the engine judged, for benchmarks/f32_paths.py (`--peer`). Runs in the side environment
(bash benchmarks/install_hf.sh; torch never enters .venv):

    .venv-hf/bin/python benchmarks/hf_logits.py --model mini-qwen-hybrid --sequences seq.json --out hf.npz

seq.json is what `python -m benchmarks.f32_paths ... --dump-sequence seq.json` writes: {"prompt": [...],
"tokens": [...]}. The output holds `logits` [len(tokens), V]: one full forward over prompt + tokens (no cache, the
plainest path through transformers' code, as benchmarks/hf_oracle.py's greedy), the rows that predict each token.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="transformers' float32 logits along given sequences")
    ap.add_argument("--model", required=True, help="a mini checkpoint under engines/minis")
    ap.add_argument("--sequences", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    ckpt = ROOT / "engines" / "minis" / a.model
    if not (ckpt / "config.json").is_file():
        print(f"error: --model {a.model}: no checkpoint at {ckpt}", file=sys.stderr)
        return 2
    try:
        seq = json.loads(Path(a.sequences).read_text())
        prompt, tokens = [int(t) for t in seq["prompt"]], [int(t) for t in seq["tokens"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"error: --sequences {a.sequences}: {e}", file=sys.stderr)
        return 2
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32,
                                                              attn_implementation="eager").eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0]
    n = len(prompt)
    np.savez(a.out, logits=logits[n - 1:n - 1 + len(tokens)].double().numpy(),
             torch=torch.__version__, transformers=transformers.__version__)
    print(f"wrote {a.out}: {len(tokens)} positions, transformers {transformers.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
