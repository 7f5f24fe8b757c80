"""benchmarks/detection.py's tables: the Markdown rows of a table's JSON (with, for bf16, the float32 build's
column), and tables run apart (--part) merged into one."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from evalsuite.compare import peers

RULES = ("evalsuite",) + peers.RULES


def table(rows: list[dict], build32: dict | None = None) -> str:
    """build32: (model, fault) -> the float32 table's evalsuite first catch, for a bf16 table: a bf16 `diff` also
    runs the engine's float32 build on the same prompts (evalsuite/compare/build.py), so it FAILs at the
    earlier of the two catches (a column derived from the two committed tables, not a third run)."""
    extra = ["evalsuite + float32 build"] if build32 is not None else []
    head = "| fault | dtype | model | " + " | ".join([*RULES, *extra]) + " | prompts run |"
    lines = [head, "|" + " --- |" * (len(RULES) + len(extra) + 4)]
    for r in rows:
        cells = [_cell(r["first_caught"][k], r["fault"]) for k in RULES]
        was = r.get("evalsuite_recheck", {}).get("before", r["first_caught"]["evalsuite"])
        if was != r["first_caught"]["evalsuite"]:  # re-checked under today's rule and moved: say so
            cells[0] += f" (was {_cell(was, r['fault'])})"
        if build32 is not None:
            both = [v for v in (r["first_caught"]["evalsuite"], build32.get((r["model"], r["fault"]))) if v]
            cells.append(_cell(min(both) if both else None, r["fault"]))
        lines.append(f"| {r['fault'] or 'faithful (false alarms)'} | {r['dtype']} | {r['model']} | "
                     + " | ".join(cells) + f" | {r['prompts_taken']} |")
    return "\n".join(lines)


def _cell(v: int | None, fault: str | None) -> str:
    """A rule's first catch, or on the faithful engine (fault None) a false alarm."""
    return "-" if v is None else (f"FALSE ALARM at {v}" if fault is None else str(v))


def float32_catches(bf16: dict, path: str) -> dict:
    """The float32 table's evalsuite catches by (model, fault); its prompts must be the bf16 table's."""
    f32 = json.loads(Path(path).read_text())
    key = ("prompts", "order_seed", "max_new_tokens")
    if f32.get("dtype") != "float32" or any(f32.get(k) != bf16.get(k) for k in key):
        raise ValueError(f"{path} is not a float32 table over the same prompts ({', '.join(key)})")
    return {(r["model"], r["fault"]): r["first_caught"]["evalsuite"] for r in f32["rows"]}


SETTINGS = ("prompts", "order_seed", "max_new_tokens", "dtype")


def merge(paths: list[str], out: Path, replace: bool = False) -> int:
    """--out from the rows of several tables run apart (--part, one process a model): same settings, no row twice
    (replace: a later table's row takes an earlier one's place)."""
    docs = []
    for p in paths:
        try:
            docs.append(json.loads(Path(p).read_text()))
            if not isinstance(docs[-1].get("rows"), list):
                raise ValueError("no rows")
        except (OSError, ValueError, AttributeError) as e:
            print(f"error: {p} is not a detection table ({e})", file=sys.stderr)
            return 2
    settings = {tuple(d.get(k) for k in SETTINGS) for d in docs}
    if len(settings) > 1:
        print(f"error: the tables were written with other settings {sorted(settings, key=str)}", file=sys.stderr)
        return 2
    rows: dict = {}
    for p, d in zip(paths, docs):
        for r in d["rows"]:
            key = (r["model"], r["fault"])
            if key in rows and not replace:
                print(f"error: {p} repeats the row ({r['model']}, {r['fault']}); --replace to take it", file=sys.stderr)
                return 2
            rows[key] = r
    rows = list(rows.values())
    doc = {**docs[0], "rows": rows, "seconds": round(sum(d.get("seconds", 0) for d in docs), 1),
           "merged_from": len(docs)}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1))
    print(f"{out}: {len(rows)} rows from {len(docs)} tables")
    return 0
