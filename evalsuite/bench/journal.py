"""Append-only, crash-safe request journal: each finished request is written (and fsynced) at once,
so a killed run resumes without redoing or losing anything. Keys include engine, model, weight
hash, dtype, fault and the request itself (lm-eval's own cache ignores the model: never used)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from evalsuite.errors import SpecError


def request_key(identity: dict, kind: str, payload) -> str:
    blob = json.dumps([identity, kind, payload], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


class Journal:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.done: dict[str, dict] = {}
        if self.path.exists():
            for n, line in enumerate(self.path.read_text("utf-8").splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                    self.done[rec["key"]] = rec
                except (json.JSONDecodeError, KeyError, TypeError):
                    raise SpecError(f"corrupt journal line {n} in {self.path}: delete that line (or the file) "
                                    "to redo those requests") from None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a", encoding="utf-8")

    def get(self, key: str) -> dict | None:
        return self.done.get(key)

    def add(self, records: list[dict]) -> None:
        for r in records:
            self._f.write(json.dumps(r, ensure_ascii=False) + "\n")
            self.done[r["key"]] = r
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()
