"""Prompt sets: the built-in ones (written for this project) and user JSONL files.

A line is {"id": str, "kind": "raw" | "chat", "text": str} or {"id": str, "token_ids": [int, ...]}.
"chat" applies the model's chat template; "raw" encodes the text as is. A raw line may add
"tokens": N: the text's ids are repeated and cut to exactly N, whatever the model's tokenizer (how the
built-in sets put a context end at, just before and just after the megakernel's 128-slot attention
tile boundary, and fill a cache window to its last slot).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from evalsuite.errors import SpecError

BUILTIN = ("builtin", "quick")  # builtin: 36 prompts incl. two of 1,000+ tokens; quick: 12 of them
# What each built-in set is written to drive, as engines.base.PATHS names: `diff` (main part + batching part) on it
# takes each of these paths in the built-in engines (tests/evalsuite/test_prompts.py measures it), with the prompts
# that do it. A user's set states nothing: diff reports the paths it measured.
COVERS = {
    "builtin": {
        "multi_tile": "tile-129 and tile-255 run past one 128-slot attention tile; long-ledger and long-journey past "
                      "the 512- and 768-slot windows",
        "prefill_split": "long-ledger and long-journey (1,000+ tokens) make the first admission of the batching "
                         "part too large for one prefill call",
        "shared_prefix_unaligned": "tile-127, tile-128, tile-129 and tile-255 share a 126-token prefix (not a "
                                   "power of two)",
        "refill_group": "36 prompts, more than any engine's rows, ending in pairs (the batching part's stops)",
        "shrink": "the batching part's last rows end one by one",
        "stop": "chat prompts end at end-of-turn; the rest at their staggered stops",
    },
    "quick": {
        "multi_tile": "tile-129 and long-600 run past one 128-slot attention tile",
        "prefill_split": "long-600 makes the first admission of the batching part too large for one prefill call",
        "shared_prefix_unaligned": "tile-127, tile-128, tile-129 and long-600 share a 126-token prefix",
        "refill_group": "12 prompts, more than the megakernel's 8 rows, ending in pairs",
        "shrink": "the batching part's last rows end one by one",
        "stop": "every prompt at its staggered stop",
    },
}


@dataclass(frozen=True)
class Prompt:
    id: str
    kind: str  # raw, chat or ids
    text: str | None = None
    token_ids: tuple[int, ...] | None = None
    tokens: int | None = None  # raw text cut (or repeated) to exactly this many ids

    def encode(self, tokenizer) -> list[int]:
        if self.kind == "ids":
            return list(self.token_ids)
        if tokenizer is None:
            raise SpecError(f"prompt {self.id!r} is text but the model has no tokenizer")
        if self.kind == "chat":
            return tokenizer.encode_chat(self.text)
        ids = tokenizer.encode(self.text)
        if self.tokens is None:
            return ids
        body = tokenizer.encode(" " + self.text)[len(tokenizer.encode("")):]  # repeats: no second BOS
        while len(ids) < self.tokens:
            ids = ids + body
        return ids[:self.tokens]


@dataclass(frozen=True)
class PromptSet:
    name: str
    prompts: tuple[Prompt, ...]

    @property
    def sha256(self) -> str:
        canon = [dict(id=p.id, kind=p.kind, text=p.text, token_ids=p.token_ids)
                 | ({"tokens": p.tokens} if p.tokens else {}) for p in self.prompts]
        return hashlib.sha256(json.dumps(canon, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def _parse(lines: list[str], where: str) -> tuple[Prompt, ...]:
    out: list[Prompt] = []
    seen: set[str] = set()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            o = json.loads(line)
        except json.JSONDecodeError as e:
            raise SpecError(f"{where}:{n}: not valid JSON ({e.msg})") from None
        if not isinstance(o, dict) or not isinstance(o.get("id"), str) or not o["id"]:
            raise SpecError(f"{where}:{n}: each line needs a non-empty string 'id'")
        if o["id"] in seen:
            raise SpecError(f"{where}:{n}: duplicate id {o['id']!r}")
        seen.add(o["id"])
        if "token_ids" in o:
            ids = o["token_ids"]
            if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and t >= 0 for t in ids):
                raise SpecError(f"{where}:{n}: 'token_ids' must be a non-empty list of non-negative ints")
            out.append(Prompt(o["id"], "ids", token_ids=tuple(ids)))
        else:
            kind = o.get("kind", "raw")
            if kind not in ("raw", "chat") or not isinstance(o.get("text"), str) or not o["text"]:
                raise SpecError(f"{where}:{n}: need 'text' (non-empty) and 'kind' raw or chat, or 'token_ids'")
            n_tok = o.get("tokens")
            if n_tok is not None and (kind != "raw" or not isinstance(n_tok, int) or isinstance(n_tok, bool)
                                      or n_tok < 1):
                raise SpecError(f"{where}:{n}: 'tokens' must be a positive int, on a raw prompt")
            out.append(Prompt(o["id"], kind, text=o["text"], tokens=n_tok))
    if not out:
        raise SpecError(f"{where}: no prompts")
    return tuple(out)


def load_prompts(name_or_path: str) -> PromptSet:
    """A built-in set by name, or a JSONL file."""
    if name_or_path in BUILTIN:
        text = resources.files("evalsuite.prompt_sets").joinpath(f"{name_or_path}.jsonl").read_text("utf-8")
        return PromptSet(name_or_path, _parse(text.splitlines(), name_or_path))
    p = Path(name_or_path)
    if not p.is_file():
        raise SpecError(f"prompt set {name_or_path!r} is neither a built-in set ({', '.join(BUILTIN)}) "
                        "nor a file")
    return PromptSet(str(p), _parse(p.read_text("utf-8").splitlines(), str(p)))
