"""The SmolLM2 GGUF as a plain Hugging Face folder, for `transformers serve` (run in .venv-tserve).

    .venv-tserve/bin/python interop/tserve_model.py GGUF OUT_DIR

transformers dequantizes the GGUF (Q4_1) to float32 on load; a model loaded from a GGUF cannot be
saved as it is, so its weights are copied into a plain model of the same config and that is saved,
with the GGUF's tokenizer. The served numbers are then the Q4_1 weights in float32.
"""

import sys
from pathlib import Path

from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer


def main(gguf: str, out: str) -> None:
    src, name = str(Path(gguf).parent), Path(gguf).name
    loaded = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype="float32")
    config = AutoConfig.from_pretrained(src, gguf_file=name)
    plain = AutoModelForCausalLM.from_config(config, dtype="float32")
    missing = plain.load_state_dict(loaded.state_dict(), strict=False)
    if missing.missing_keys and missing.missing_keys != ["lm_head.weight"]:
        sys.exit(f"tserve_model: weights missing after the copy: {missing.missing_keys[:5]}")
    plain.tie_weights()
    plain.save_pretrained(out)
    AutoTokenizer.from_pretrained(src, gguf_file=name).save_pretrained(out)
    print(f"wrote {out}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
