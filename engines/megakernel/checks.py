"""The megakernel's refusals, before anything is built: each a one-line error naming the bad value or the missing
layer, and what to use instead."""

from __future__ import annotations

import jax

from engines.base import DTYPES, ROUND_POINTS
from engines.config import Config
from engines.errors import ModelError, UnsupportedModel
from engines.megakernel.faults import ALL_FAULTS, BY_NAME, MODEL_NEEDS
from engines.megakernel.spec import EXPERT_FORMATS, KIND_CODES, MLA_FORMS, SUPPORTED_FEATURES
from engines.megakernel.tpu import CHIPS
from engines.recipe import POINT_SCOPE, public_rounds

INTERPRET_MODES = ("generic", "tpu", "mosaic")  # mosaic: compiled by Mosaic, on a TPU only


def check_options(c: Config, dtype: str, fault: str | None, interpret: str, kv_cache: str, experts: str,
                  chip: str, mla: str = "expanded", residual: str = "float32") -> None:
    """A ModelError for a bad setting, UnsupportedModel for layers the kernel does not implement."""
    if dtype not in DTYPES:
        raise ModelError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
    if fault is not None and fault not in ALL_FAULTS:
        raise ModelError(f"unknown fault {fault!r}; expected one of {', '.join(ALL_FAULTS)}")
    needs = BY_NAME[fault].needs if fault is not None else ""
    if needs in MODEL_NEEDS and not MODEL_NEEDS[needs][1](c):
        raise ModelError(f"fault {fault} needs {MODEL_NEEDS[needs][0]}; {c.name} has none")
    if interpret not in INTERPRET_MODES:
        raise ModelError(f"--engine-option interpret={interpret!r}: expected one of {', '.join(INTERPRET_MODES)}")
    if interpret == "mosaic" and jax.default_backend() != "tpu":
        raise ModelError(f"--engine-option interpret=mosaic compiles the kernel with Mosaic, which needs a TPU; "
                         f"jax here runs on {jax.default_backend()} (docs/tpu.md)")
    kinds = sorted(set(c.layer_kinds) - set(KIND_CODES))  # layer kinds, then the other fields
    missing = ([f"layer_kinds ({', '.join(kinds)})"] if kinds else []) + \
        [f for f in c.features() if f not in SUPPORTED_FEATURES and not f.startswith("layer_kinds")]
    if c.mla_layers and c.attn_layers:  # one KV cache layout a model (spec.cache_dims)
        missing.append("attention and MLA layers in one model")
    if missing:  # the kernel implements the Llama/Qwen3/Qwen2, Gemma 2/3, gpt-oss, DeepSeek-style MoE, GDN, KDA layers
        raise UnsupportedModel(f"the megakernel does not implement {', '.join(missing)} "
                               f"(model {c.name}); use --engine reference, or another engine")
    if kv_cache not in DTYPES:
        raise ModelError(f"--engine-option kv_cache={kv_cache!r}: expected one of {', '.join(DTYPES)}")
    if residual not in DTYPES:
        raise ModelError(f"--engine-option residual={residual!r}: expected one of {', '.join(DTYPES)}")
    if experts not in EXPERT_FORMATS:
        raise ModelError(f"--engine-option experts={experts!r}: expected one of {', '.join(EXPERT_FORMATS)}")
    if needs == "mxfp4" and experts != "mxfp4":
        raise ModelError(f"fault {fault} needs MXFP4 experts: --engine-option experts=mxfp4")
    if mla not in MLA_FORMS:
        raise ModelError(f"--engine-option mla={mla!r}: expected one of {', '.join(MLA_FORMS)}")
    if mla != "expanded" and not c.mla_layers:
        raise ModelError(f"--engine-option mla={mla} is the form of MLA layers; {c.name} has none")
    if chip not in CHIPS:
        raise ModelError(f"--engine-option chip={chip!r}: expected one of {', '.join(CHIPS)}")


def round_points(c: Config, dtype: str, value: str | None) -> tuple[str, ...]:
    """--engine-option rounds (None, "none", "public" or a comma list of ROUND_POINTS) as the recipe's points, in
    ROUND_POINTS' order; () in float32 (float32 is float32). A ModelError names a bad point, or a point in a part
    the model does not have (engines.recipe.POINT_SCOPE), or "public" on a model the public kernels never round."""
    if value is None or value.strip() in ("", "none"):
        return ()
    if value.strip() == "public":
        asked = set(public_rounds(c))
        if not asked:
            raise ModelError(f"--engine-option rounds=public: the public kernels' rounding points are in "
                             f"linear-attention, MLA, latent-MoE and attention-residual layers and Muse's norms; "
                             f"{c.name} has none")
    else:
        asked = {p.strip() for p in value.split(",") if p.strip()}
    bad = sorted(asked - set(ROUND_POINTS))
    if bad:
        raise ModelError(f"--engine-option rounds={value}: unknown point {bad[0]!r}; expected public, none or a comma "
                         f"list of {', '.join(ROUND_POINTS)}")
    absent = [p for p in ROUND_POINTS if p in asked and not POINT_SCOPE[p][1](c)]
    if absent:
        raise ModelError(f"--engine-option rounds={value}: {absent[0]!r} rounds in {POINT_SCOPE[absent[0]][0]}; "
                         f"{c.name} has none")
    return tuple(p for p in ROUND_POINTS if p in asked) if dtype == "bfloat16" else ()
