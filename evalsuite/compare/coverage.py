"""What a check drove: the engine's code paths that ran (engines.base.PATHS, as the engine reports them) and
the shapes its steps took. A path the engine declares but the run never took cannot be claimed as checked: it
is named "not exercised", and a PASS cannot rest on it."""

from __future__ import annotations

from engines.base import PATHS

WIDEN = ("widen the prompts: the built-in set `builtin` (and `quick`, for the mini models) drives every path of the "
         "built-in engines (docs/verdicts.md, \"What a PASS covers\")")


def report(eng) -> dict:
    """The engine's paths: declared, exercised (with counts), not exercised, and the shapes seen (decode windows,
    attention tiles, prefill buckets, shared-prefix lengths). Where the engine reports none (a server, a plugin
    that does not say), which of its paths ran is unknown, and that is said."""
    log = eng.path_log()
    declared = tuple(eng.paths)
    if log is None or not declared:
        return {"reported": False, "declared": list(declared),
                "why": f"engine {eng.name} reports no code paths: which of its paths (refill, shrink, split prefill, "
                       "shared prefix, tiles) the run drove is unknown"}
    snap = log.snapshot()
    exercised = {p: snap["counts"][p] for p in declared if snap["counts"].get(p)}
    missing = [p for p in declared if p not in exercised]
    return {"reported": True, "declared": list(declared), "exercised": exercised, "not_exercised": missing,
            "what": {p: PATHS[p] for p in declared}, "shapes": snap["shapes"]}


# a speculative engine's accept branches are driven by its drafts, not by the prompts
WIDEN_SPEC = ("a speculative engine's accept branches depend on its drafts: --engine-option drafter=sweep drives every "
              "acceptance length (docs/speculative.md)")


def blocking(rec: dict) -> list[str]:
    """The note that keeps a PASS off the paths never exercised (none when every declared path ran)."""
    if not rec.get("reported") or not rec["not_exercised"]:
        return []
    names = "; ".join(f"{p} ({rec['what'][p]})" for p in rec["not_exercised"])
    spec = all(p.startswith("spec_") for p in rec["not_exercised"])
    return [f"engine paths not exercised by these {'drafts' if spec else 'prompts'}, so not checked: {names}; "
            f"{WIDEN_SPEC if spec else WIDEN}"]


def text(rec: dict) -> str:
    """One line for reports."""
    if not rec.get("reported"):
        return rec.get("why", "not reported")
    ran = ", ".join(f"{p} x{n}" for p, n in rec["exercised"].items())
    shapes = "; ".join(f"{k} {v}" for k, v in rec["shapes"].items())
    miss = ", ".join(rec["not_exercised"]) or "none"
    return f"exercised: {ran}; NOT exercised: {miss}" + (f"; shapes: {shapes}" if shapes else "")
