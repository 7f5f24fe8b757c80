"""Bisection at diff's first real mismatch: the failing context reproduced first (the same batch, row and decode
steps, then the prompt alone), and only then the first layer whose residual stream leaves the tolerance."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from evalsuite.compare import batching, rule

# A layer's hidden state "leaves tolerance" in bisection when max |Δ| exceeds this. Faithful
# megakernel taps match the reference to 3e-6 (f32, mini models); in bf16 every layer drifts,
# so bisection there is a hint, not a proof.
TAP_TOL = {"float32": 1e-3, "bfloat16": 0.5}


def first_mismatch(run, part: dict, progress: Callable[[str], None]) -> dict | None:
    """At the first real mismatch, the failing context reproduced before layers are narrowed (_bisect); for a
    mismatch only the batching part found, whether the prompt alone reproduces it."""
    first = next(((i, r["real_positions"][0]) for i, r in enumerate(run.per_prompt) if r["real_positions"]), None)
    if first is not None:
        if not run.caps.taps:
            return None
        progress("diff: bisection (the failing batch, then the prompt alone)")
        i, j = first
        idx, row = run.group_of[i]
        out = in_context(run, idx, row, j)
        out["prompt"] = run.encoded[i][0].id
        return out
    flagged = [r for r in part.get("per_prompt", []) if r["real_positions"]]
    if not flagged:
        return None
    return batching_only(run, flagged[0], progress)


def in_context(run, idx: list[int], row: int, j: int) -> dict:
    """Position j of prompt idx[row] (its main-part group idx): the per-layer taps of the decode step that scored
    it, first in the failing context (every row of its group at that step, each row's earlier tokens fed by
    decode steps as the teacher-forced run fed them, so the same batch, row and window), then for the prompt
    alone; the first layer whose residual stream leaves TAP_TOL in each. Whether the bug reproduces alone is
    said: a bug that needs its batch does not."""
    tap_tol, eng, i = TAP_TOL[run.spec.dtype], run.eng, idx[row]

    def ctx(k: int) -> list[int]:  # position j is predicted from ctx
        return list(run.encoded[k][1]) + list(run.ref_tokens[k][:j])

    want = run.ref.score([ctx(i)], want_taps=True)[0].taps[:, -1]  # [L, D]
    if len(run.encoded[i][1]) < 2:  # a one-token prompt's first position comes from the engine's forward pass
        got = eng.score([ctx(i)], want_taps=True)[0].taps[:, -1]
        return _layers(want, got, tap_tol) | {"position": j, "context": "the engine's forward pass (score)",
                                              "reproduced": "alone"}
    rows = [k for k in idx if len(run.encoded[k][1]) >= 2]
    in_batch = eng.step_taps([ctx(k)[:-1] for k in rows], [ctx(k)[-1] for k in rows], decoded=j)[rows.index(i)]
    alone = eng.step_taps([ctx(i)[:-1]], [ctx(i)[-1]], decoded=j)[0]
    b, a = _layers(want, in_batch, tap_tol), _layers(want, alone, tap_tol)
    where = {(True, True): "in its batch and alone", (True, False): "in its batch only (not alone)",
             (False, True): "alone only", (False, False): "in neither: no layer leaves the tolerance in one "
             "tapped step, so the bug lives outside the step (the loop, the cache bookkeeping) or below TAP_TOL; "
             "layers not narrowed"}[(b["layer"] is not None, a["layer"] is not None)]
    return {"position": j, "layer": b["layer"] if b["layer"] is not None else a["layer"],
            "context": {"batch": len(rows), "row": rows.index(i), "decoded_steps": j,
                        "prompt_tokens": len(run.encoded[i][1])},
            "reproduced": where, "tap_tolerance": tap_tol, "max_dhidden_per_layer": b["max_dhidden_per_layer"],
            "alone": a}


def _layers(want: np.ndarray, got: np.ndarray, tap_tol: float) -> dict:
    per_layer = np.abs(want - got).max(axis=-1)
    bad = np.flatnonzero(per_layer > tap_tol)
    return {"layer": int(bad[0]) if bad.size else None, "max_dhidden_per_layer": [float(x) for x in per_layer]}


def batching_only(run, row: dict, progress: Callable[[str], None]) -> dict:
    """A mismatch only the batching part found: the prompt generated alone, with the same stop ids and budget; if
    it then matches the reference, the bug lives in the batching path, and layers are not narrowed."""
    progress(f"diff: bisection (prompt {row['id']} of the batching part, alone)")
    n, N = row["reference_end"], run.spec.max_new_tokens
    i = next((k for k, (p, _) in enumerate(run.encoded) if p.id == row["id"]), None)
    if i is None:  # a synthetic prompt of the batching part: its tokens and track come from the reference again
        prompt = dict(batching.synthetic([ids for _, ids in run.encoded], N, run.model.config.max_context))[row["id"]]
        rg = run.ref.generate([prompt], N, top_k=5, want_logits=True)[0]
        tokens, track = rg.token_ids, rg.track()
    else:
        prompt, tokens, track = run.encoded[i][1], run.ref_tokens[i], run.tracks[i]
    g = run.eng.generate([prompt], N, stop_ids=run.eos(), top_k=5)[0]
    rec = rule.compare_prompt(tokens[:n], batching.cut(track, n), None, g, run.tol)
    alone_ok = not rec["real_positions"]
    return {"prompt": row["id"], "position": (row["first_divergence"] or {}).get("position"), "layer": None,
            "context": {"found_in": f"batching part, call {row['call']!r}"},
            "reproduced": ("not alone: the prompt alone matches the reference, so the bug lives in how the engine "
                           "batches (refill, shrink, stops, split prefill or a shared prefix); layers not narrowed"
                           if alone_ok else "alone too: see the main part's bisection of that prompt"),
            "alone": {"real_positions": rec["real_positions"]}}
