"""The witness's tables in docs/faults.md, rendered from benchmarks/results/f32-paths-*.json (written by
`python -m benchmarks.f32_paths`): a flagged float32 position, each engine's every path against float64."""

from __future__ import annotations

from pathlib import Path

from evalsuite.doctables import RESULTS, _sci, _source, _table

F32_PATHS = "f32-paths-*.json"


def f32_paths(root: Path) -> str:
    import json

    files = sorted((root / RESULTS).glob(F32_PATHS))
    if not files:
        return f"not measured: no `{RESULTS}/{F32_PATHS}`.\n"
    docs = [json.loads(f.read_text("utf-8")) for f in files]
    rows = []
    for d in docs:
        ratio = d["worst_dlogit"]["megakernel"] / d["worst_dlogit"]["reference"]
        for who in ("reference", "megakernel"):
            mine = [r for r in d["rows"] if r["engine"] == who]
            worst = max(mine, key=lambda r: r["dlogit"])
            rows.append([d["model"], f"{d['prompt']} position {d['position']}", who, str(len(mine)),
                         f"{_sci(worst['dlogit'])} ({worst['path']})", _sci(max(r["kl"] for r in mine)),
                         f"{ratio:.2f}x" if who == "megakernel" else "",
                         _sci(mine[0]["median_dlogit"])])
    return (_source(*(f"{RESULTS}/{f.name}" for f in files), how=" (`python -m benchmarks.f32_paths`)")
            + _table(["model", "position", "engine", "paths", "worst |Δlogit| from float64 (its path)", "worst KL",
                      "megakernel / reference", "prompt's median |Δlogit|"], rows))
