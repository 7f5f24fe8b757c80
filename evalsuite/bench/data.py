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
           "gpqa": ("Record ID", "Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2",
                    "Incorrect Answer 3"),
           "sanity": ("question", "answer", "choices", "label")}
PATTERNS = {"gsm8k": ("test*.parquet", "test*.jsonl", "test*.csv", "*gsm8k*test*"),
            "gpqa": ("gpqa_diamond*.csv", "gpqa_diamond*.parquet", "gpqa_diamond*.jsonl", "*diamond*"),
            "sanity": ("sanity*.jsonl",)}
# the split lm-eval draws few-shot exemplars from (gsm8k: 5-shot from train), where a task has one
FEWSHOT = {"gsm8k": TASKS_DIR / "data" / "gsm8k_fewshot.jsonl"}
NUM_FEWSHOT = {"gsm8k": 5}  # the task YAMLs' num_fewshot
FEWSHOT_PATTERNS = {"gsm8k": ("train*.parquet", "train*.jsonl", "train*.csv", "*gsm8k*train*")}
# --data hub: (dataset, config, split) as lm-eval's own tasks load them
HUB = {"gsm8k": ("openai/gsm8k", "main", "test"), "gpqa": ("Idavidrein/gpqa", "gpqa_diamond", "train")}
HUB_FEWSHOT = {"gsm8k": ("openai/gsm8k", "main", "train")}
# a column that names each item uniquely, checked for duplicates (gsm8k has none: its question text is used)
ID_COLUMN = {"gsm8k": "question", "gpqa": "Record ID"}  # sanity repeats questions by design (gen + mc)
HUB_HOST = "huggingface.co"


@dataclass(frozen=True)
class Data:
    path: Path  # the file the run reads (for the hub: the cached JSONL it was written to)
    source: str  # "bundled", "dir" or "hub"
    origin: str  # what the user named: the bundled file, the folder, or dataset/config/split
    fewshot: Path | None = None  # the split few-shot exemplars are drawn from (gsm8k: train)

    @property
    def bundled(self) -> bool:
        return self.source == "bundled"


def resolve(task: str, data: str | None) -> Data:
    """data: None or "bundled" (the sample shipped with evalsuite), "hub", or a folder."""
    if data in (None, "bundled"):
        return Data(BUNDLED[task], "bundled", str(BUNDLED[task]), FEWSHOT.get(task))
    if data == "hub":
        return Data(from_hub(task), "hub", "/".join(HUB[task]),
                    from_hub(task, HUB_FEWSHOT[task]) if task in HUB_FEWSHOT else None)
    path, _ = resolve_data(task, data)
    return Data(path, "dir", str(data), _fewshot_file(task, path, Path(data)) if task in FEWSHOT else None)


def _fewshot_file(task: str, test: Path, folder: Path) -> Path:
    """The train split beside the test file (else anywhere under the folder), checked like the test file."""
    for where in (test.parent, folder):
        found = [p for pat in FEWSHOT_PATTERNS[task] for p in sorted(where.rglob(pat)) if p.is_file()]
        if found:
            rows = load_rows(found[0])
            check_rows(task, found[0], rows, unique=False)
            if len(rows) < NUM_FEWSHOT[task]:
                raise SpecError(f"{found[0]}: {len(rows)} rows, fewer than the {NUM_FEWSHOT[task]} exemplars "
                                f"each {task} prompt draws from it")
            return found[0]
    raise SpecError(f"--data {folder}: no {task} train split ({', '.join(FEWSHOT_PATTERNS[task])}): its few-shot "
                    "exemplars are drawn from it, as lm-eval's")


def cache_dir() -> Path:
    return Path(os.environ.get("EVALSUITE_DATA_CACHE") or Path.home() / ".cache" / "evalsuite" / "data")


def from_hub(task: str, source: tuple[str, str, str] | None = None) -> Path:
    """The task's test set (or source: another split) from the hub, written once as JSONL under
    cache_dir(); one-line errors for a task without a hub source, a gated set without HF_TOKEN, an
    offline setting or no network."""
    if task not in HUB:
        raise SpecError(f"--data hub: {task} has no hub source (it is evalsuite's own bundled set)")
    repo, name, split = source or HUB[task]
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
    check_rows(task, path, load_rows(path))
    return path, False


def check_rows(task: str, path: Path, rows: list[dict], unique: bool = True) -> None:
    """One-line errors for a file that cannot be the task's data: no rows, missing columns, duplicate ids."""
    if not rows:
        raise SpecError(f"{path}: no rows (an empty {task} file)")
    unique = unique and task in ID_COLUMN
    need = COLUMNS[task] + ((ID_COLUMN[task],) if unique and ID_COLUMN[task] not in COLUMNS[task] else ())
    missing = [c for c in need if c not in rows[0]]
    if missing:
        raise SpecError(f"{path}: missing columns {missing} (the hub schema for {task} has {list(need)})")
    if unique:
        seen: dict = {}
        for i, r in enumerate(rows):
            key = str(r[ID_COLUMN[task]])
            if key in seen:
                what = f"{ID_COLUMN[task]} {key!r}" if ID_COLUMN[task] == "Record ID" else f"{ID_COLUMN[task]} text"
                raise SpecError(f"{path}: duplicate item: rows {seen[key]} and {i} have the same {what}")
            seen[key] = i


def _blank(path: Path, kind: str) -> bool:
    """A file without one data row: empty, or (CSV) a header only. `datasets` refuses those with an
    error that does not say so."""
    if kind == "parquet":
        return False
    data = path.read_bytes()
    if kind == "csv":
        data = data.split(b"\n", 1)[1] if b"\n" in data else b""
    return not data.strip()


def load_rows(path: Path) -> list[dict]:
    offline()
    import datasets

    kind = {".parquet": "parquet", ".csv": "csv", ".jsonl": "json", ".json": "json"}.get(path.suffix)
    if kind is None:
        raise SpecError(f"{path}: unsupported data format {path.suffix} (parquet, csv, jsonl)")
    if _blank(path, kind):
        return []
    datasets.disable_progress_bars()  # local files: a bar per file is noise (and not one line on errors)
    try:
        return list(datasets.load_dataset(kind, data_files=str(path), split="train"))
    except Exception as e:  # datasets raises many kinds for malformed files; the cause, on one line
        cause = e
        while cause.__cause__ is not None or cause.__context__ is not None:
            cause = cause.__cause__ or cause.__context__
        text = " ".join(str(cause).split())[:200]
        raise SpecError(f"{path}: cannot read as {kind} ({type(cause).__name__}: {text})") from None
