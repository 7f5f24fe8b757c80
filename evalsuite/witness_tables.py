"""The witness's tables in docs/faults.md, rendered from benchmarks/results/f32-paths-*.json (written by
`python -m benchmarks.f32_paths`): a flagged float32 position, each engine's every path against float64."""

from __future__ import annotations

import json
from pathlib import Path

from evalsuite.doctables import RESULTS, _sci, _source, _table
from evalsuite.roles import JUDGE

F32_PATHS = "f32-paths-*.json"


def f32_paths(root: Path) -> str:
    files = sorted((root / RESULTS).glob(F32_PATHS))
    if not files:
        return f"not measured: no `{RESULTS}/{F32_PATHS}`.\n"
    docs = [json.loads(f.read_text("utf-8")) for f in files]
    rows = []
    for d in docs:
        names = list(dict.fromkeys(r["engine"] for r in d["rows"]))  # the judge, then the engine measured
        for who in names:
            mine = [r for r in d["rows"] if r["engine"] == who]
            worst = max(mine, key=lambda r: r["dlogit"])
            ratio = "" if who == JUDGE else f"{d['worst_dlogit'][who] / d['worst_dlogit'][JUDGE]:.2f}x"
            rows.append([d["model"], f"{d['prompt']} position {d['position']}", who, str(len(mine)),
                         f"{_sci(worst['dlogit'])} ({worst['path']})", _sci(max(r["kl"] for r in mine)), ratio,
                         _sci(mine[0]["median_dlogit"])])
    return (_source(*(f"{RESULTS}/{f.name}" for f in files), how=" (`python -m benchmarks.f32_paths`)")
            + _table(["model", "position", "engine", "paths", "worst abs Δlogit from float64 (its path)", "worst KL",
                      "worst / the judge's worst", "the prompt's median abs Δlogit"], rows))
