"""The engine list, defined once: every class declared under the `evalsuite.engines` entry-point group
(the built-in reference, megakernel and openai engines are declared in pyproject.toml the same way a
user's package declares its own). `make_engine` is the one place an engine is built."""

from __future__ import annotations

import difflib
import inspect
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points

from engines.base import Engine, EngineOptions
from engines.errors import ModelError
from evalsuite.distributed import default_mesh
from evalsuite.models import Model

GROUP = "evalsuite.engines"


@dataclass(frozen=True)
class Plugin:
    name: str
    target: str  # module:Class
    distribution: str | None  # the installed package that declares it
    version: str | None
    entry: EntryPoint  # what loads it


def plugins() -> dict[str, Plugin]:
    """Every declared engine by name (not imported yet)."""
    out = {}
    for ep in entry_points(group=GROUP):
        dist = ep.dist
        out.setdefault(ep.name, Plugin(ep.name, ep.value, dist.name if dist else None,
                                       dist.version if dist else None, ep))
    if not out:
        raise ModelError(f"no engines are declared under the {GROUP!r} entry-point group: evalsuite's own "
                         "install is missing its metadata (rerun `bash install.sh` or `pip install -e .`)")
    return out


def names() -> tuple[str, ...]:
    return tuple(sorted(plugins()))


def engine_class(name: str) -> type[Engine]:
    """The engine class declared as `name`, imported; a one-line error for an unknown name, a plugin that
    fails to import, or a class that is not a complete engines.base.Engine."""
    known = plugins()
    if name not in known:
        close = difflib.get_close_matches(name, list(known), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ModelError(f"unknown engine {name!r}{hint} (installed: {', '.join(sorted(known))}; "
                         "`evalsuite engines` lists them)")
    p = known[name]
    try:
        cls = p.entry.load()
    except Exception as e:  # whatever a user's module raises on import
        raise ModelError(f"engine plugin {name!r} ({p.target}) failed to import: {type(e).__name__}: {e}") from None
    if not (inspect.isclass(cls) and issubclass(cls, Engine)):
        raise ModelError(f"engine plugin {name!r} ({p.target}) is not a subclass of engines.base.Engine")
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(cls.__abstractmethods__))
        raise ModelError(f"engine plugin {name!r} ({p.target}) does not implement {missing}")
    return cls


def make_engine(name: str, model: Model, dtype: str = "float32", fault: str | None = None,
                extra: dict | None = None) -> Engine:
    """An engines.base.Engine. fault: a self-test aid, one of the engine class's `faults`. extra: --engine-option
    KEY=VALUE pairs, each one of the engine class's `options` (a server engine's base_url, served_model,
    api_key_env and timeout among them: the CLI's --base-url and its companions)."""
    cls = engine_class(name)
    extra = dict(extra or {})
    if extra.get("base_url") and not cls.takes_remote:
        raise ModelError(f"--base-url applies to a server engine (e.g. openai), not {name}")
    if cls.takes_remote and not extra.get("base_url"):
        raise ModelError(f"--engine {name} needs --base-url URL (e.g. http://127.0.0.1:8000/v1)")
    if "mesh" in cls.options and "mesh" not in extra and default_mesh():
        extra["mesh"] = default_mesh()  # evalsuite --mesh: every engine that takes one (the judge included)
    for key in extra:
        if key not in cls.options:
            offered = f"one of {', '.join(cls.options)}" if cls.options else "none"
            raise ModelError(f"--engine-option {key!r}: engine {name} takes {offered}")
    if fault is not None and fault not in cls.faults:
        offered = f"one of {', '.join(cls.faults)}" if cls.faults else "none (it has no fault injection)"
        raise ModelError(f"--fault {fault!r}: engine {name} accepts {offered}")
    eng = cls.create(model, EngineOptions(dtype=dtype, fault=fault, extra=extra))
    if not isinstance(eng, Engine):
        raise ModelError(f"engine plugin {name!r}: create() returned {type(eng).__name__}, not an engines.base.Engine")
    return eng


def judge(model: Model, dtype: str = "float32", order_seed: int | None = None, recipe=None):
    """The reference as a judge (diff's, the golden files', their bf16 recipes), on the global mesh
    (`evalsuite --mesh`): the one place a judge is built, so none is left unsharded. order_seed: the same model
    with its hidden and MLP dimensions permuted (engines.weights.permuted; read whole on the host), so that every
    sum over them runs in another order: the bf16 witness's other reduction orders (compare/witness.py).
    recipe (engines.base.Recipe, bfloat16): the roundings an engine declared; None, the reference's default."""
    from engines.reference import ReferenceEngine
    from engines.reference.engine import WITNESS_MAX_BYTES
    from engines.weights import permuted

    if order_seed is not None and model.weights.nbytes > WITNESS_MAX_BYTES:  # the same host bound as float64's
        raise ModelError(f"a permuted float32 copy of the weights would take {model.weights.nbytes / 2**30:.1f} GiB "
                         f"(> {WITNESS_MAX_BYTES / 2**30:.0f})")
    weights = model.weights if order_seed is None else permuted(model.weights, order_seed)
    return ReferenceEngine(weights, dtype, mesh=default_mesh(), recipe=recipe)


def check_mesh(text: str) -> None:
    """A --mesh for the judge, parsed by the judge's own code: a malformed one raises a one-line error before any
    model is loaded."""
    from engines.reference.sharding import parse_mesh

    parse_mesh(text)


def fault_catalogue(name: str) -> list[dict]:
    """The declared engine's fault table rows (engines.base.Engine.fault_catalogue), for the docs."""
    return engine_class(name).fault_catalogue()


def describe() -> list[dict]:
    """For `evalsuite engines`: each declared engine, whether it loads, and what it offers."""
    rows = []
    for name, p in sorted(plugins().items()):
        row = {"name": name, "target": p.target, "distribution": p.distribution, "version": p.version}
        try:
            cls = engine_class(name)
            row |= {"ok": True, "faults": list(cls.faults), "options": list(cls.options), "server": cls.takes_remote,
                    "doc": " ".join((inspect.getdoc(cls) or "").split("\n\n")[0].split())}
        except ModelError as e:
            row |= {"ok": False, "error": str(e)}
        rows.append(row)
    return rows
