"""Where a benchmark's items come from: the bundled samples (offline default), a folder of files in the
hub schema (`--data DIR`, e.g. ../shared/data), or the hub itself (`--data hub`, through `datasets`,
cached; GPQA is gated and needs HF_TOKEN). Every run names the source, the file's sha256 and the count."""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from evalsuite.errors import SpecError


def _tasks_dir() -> Path:
    """The tasks/ package's folder (task YAMLs and bundled data), in a checkout or an installed wheel."""
    from importlib.resources import files

    return Path(str(files("tasks")))


TASKS_DIR = _tasks_dir()


def offline() -> None:
    """Every dataset evalsuite reads is a local file: never let `datasets`/lm-eval reach for the hub (on a
    machine without it they wait on timeouts). Called before either library is first used, not at import
    (the user's own environment wins where it says otherwise)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
BUNDLED = {"gsm8k": TASKS_DIR / "data" / "gsm8k_sample.jsonl", "gpqa": TASKS_DIR / "data" / "gpqa_sample.jsonl",
           "sanity": TASKS_DIR / "data" / "sanity.jsonl"}
COLUMNS = {"gsm8k": ("question", "answer"),
           "gpqa": ("Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3"),
           "sanity": ("question", "answer", "choices", "label")}
PATTERNS = {"gsm8k": ("test*.parquet", "test*.jsonl", "test*.csv", "*gsm8k*test*"),
            "gpqa": ("gpqa_diamond*.csv", "gpqa_diamond*.parquet", "gpqa_diamond*.jsonl", "*diamond*"),
            "sanity": ("sanity*.jsonl",)}
# --data hub: (dataset, config, split) as lm-eval's own tasks load them
HUB = {"gsm8k": ("openai/gsm8k", "main", "test"), "gpqa": ("Idavidrein/gpqa", "gpqa_diamond", "train")}
HUB_HOST = "huggingface.co"


@dataclass(frozen=True)
class Data:
    path: Path  # the file the run reads (for the hub: the cached JSONL it was written to)
    source: str  # "bundled", "dir" or "hub"
    origin: str  # what the user named: the bundled file, the folder, or dataset/config/split

    @property
    def bundled(self) -> bool:
        return self.source == "bundled"


def resolve(task: str, data: str | None) -> Data:
    """data: None or "bundled" (the sample shipped with evalsuite), "hub", or a folder."""
    if data in (None, "bundled"):
        return Data(BUNDLED[task], "bundled", str(BUNDLED[task]))
    if data == "hub":
        return Data(from_hub(task), "hub", "/".join(HUB[task]))
    path, _ = resolve_data(task, data)
    return Data(path, "dir", str(data))


def cache_dir() -> Path:
    return Path(os.environ.get("EVALSUITE_DATA_CACHE") or Path.home() / ".cache" / "evalsuite" / "data")


def from_hub(task: str) -> Path:
    """The task's test set from the hub, written once as JSONL under cache_dir(); one-line errors for a
    task without a hub source, a gated set without HF_TOKEN, an offline setting or no network."""
    if task not in HUB:
        raise SpecError(f"--data hub: {task} has no hub source (it is evalsuite's own bundled set)")
    repo, name, split = HUB[task]
    cached = cache_dir() / f"{task}-{name}-{split}.jsonl"
    if cached.is_file():
        return cached
    token = os.environ.get("HF_TOKEN")
    if task == "gpqa" and not token:
        raise SpecError(f"--data hub: {repo} is gated: accept its terms on the hub, then set HF_TOKEN to your "
                        "access token (or use --data DIR with a local copy)")
    if "1" in (os.environ.get("HF_HUB_OFFLINE"), os.environ.get("HF_DATASETS_OFFLINE")):
        raise SpecError("--data hub: HF_HUB_OFFLINE/HF_DATASETS_OFFLINE is set: unset it on a machine with "
                        "network access, or use --data DIR with a local copy")
    try:
        socket.create_connection((HUB_HOST, 443), timeout=10).close()
    except OSError as e:
        raise SpecError(f"--data hub: cannot reach {HUB_HOST} ({e.strerror or e}): on a machine without network "
                        "access use --data DIR with a local copy (the hub schema's files)") from None
    import datasets

    try:
        rows = datasets.load_dataset(repo, name, split=split, token=token)
    except Exception as e:  # the hub answers many ways: gated, missing, rate-limited
        first = (str(e).splitlines() or [""])[0][:200]
        raise SpecError(f"--data hub: cannot load {repo} ({name}, {split}): {type(e).__name__}: {first}") from None
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in rows))
    tmp.replace(cached)
    return cached


def resolve_data(task: str, data_dir: str | None) -> tuple[Path, bool]:
    """(file, is_bundled). The data file must hold the hub schema's columns."""
    if data_dir is None:
        return BUNDLED[task], True
    d = Path(data_dir)
    if not d.is_dir():
        raise SpecError(f"--data {d}: not bundled, hub, or a directory")
    found = [p for pat in PATTERNS[task] for p in sorted(d.rglob(pat)) if p.is_file()]
    if not found:
        raise SpecError(f"--data {d}: no {task} file ({', '.join(PATTERNS[task])})")
    path = found[0]
    cols = set(load_rows(path)[0].keys())
    missing = [c for c in COLUMNS[task] if c not in cols]
    if missing:
        raise SpecError(f"{path}: missing columns {missing} (the hub schema for {task} has {list(COLUMNS[task])})")
    return path, False


def load_rows(path: Path) -> list[dict]:
    offline()
    import datasets

    kind = {".parquet": "parquet", ".csv": "csv", ".jsonl": "json", ".json": "json"}.get(path.suffix)
    if kind is None:
        raise SpecError(f"{path}: unsupported data format {path.suffix} (parquet, csv, jsonl)")
    try:
        return list(datasets.load_dataset(kind, data_files=str(path), split="train"))
    except Exception as e:  # datasets raises many kinds for malformed files
        raise SpecError(f"{path}: cannot read ({type(e).__name__}: {e})") from None
