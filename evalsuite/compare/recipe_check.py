"""bf16 judged against the engine's own recipe: the reference run in the recipe the engine declares
(engines.base.Recipe: where it rounds), and the engine's per-layer residual stream compared with it, layer by
layer, against the spread of the same recipe in other reduction orders (engines.weights.permuted, the witness
diff already has). One rounding the recipe does not have FAILs here, even where it stays inside bf16's distance
from float32.

Why the layers and not the logits (docs/calibration.md, "bf16 against its own recipe"): on smollm2-135m the bf16
recipe is chaotic. Run in another reduction order, it moves the logits as far from itself as bf16 is from float32
(mean KL 1.1e-4 against 1.4e-4), so a matmul output left in bf16 or a K/V slot rounded to bf16 (1.4e-4, 1.5e-4) is
lost in that noise at the logits. In the first layers, before the chaos grows, the same comparison separates them
by orders of magnitude: the faithful megakernel is bitwise the recipe at layer 0, another order moves it by ~1e-7
(relative), and one extra rounding by ~1e-3.

The statistic, per prompt and layer: the median over the hidden elements of |engine - recipe|, over the mean
|recipe| of that layer. A median, so that the one element an order flips across a bf16 rounding boundary (seen
at layer 0: 4.4e-4 in the mean, at one element) does not count, while a rounding applied everywhere does.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from engines.errors import ModelError
from engines.weights import hidden_permutation
from evalsuite.compare.witness import ORDER_SEEDS  # the other reduction orders: two of four flipped on smollm2

# Prompts per run whose taps are compared: the shortest. With few context K/V entries the other reduction orders
# agree (a rounding flip in one entry moves the whole attention output: on builtin's long prompts the orders are
# 2e-4 to 4e-4 apart at layer 0, as far as one extra rounding), while a rounding applied at every position shows
# at every length. Each costs one engine step_taps, one recipe forward and one forward per order.
TAP_PROMPTS = 6
# Tokens fed by decode steps before the tapped step, so the cache that step reads was written by the engine's
# decode path (a decode-written K/V slot rounded to bf16 shows only there).
TAP_DECODED = 8
# Per prompt and layer, the engine's error may be at most FACTOR x the largest of the other orders' on that prompt at
# that layer, and never counts below FLOOR; a layer FAILs where the engine passes its bound on more than MAJORITY of
# the prompts. Measured on smollm2-135m (benchmarks/calibrate_recipe.py, results/calibrate-recipe.json; docs/
# calibration.md), builtin's 6 shortest prompts (5-9 tokens), taps after 8 decode steps, layer 0: other orders
# 2.6e-7 to 1.2e-4 (below 2e-5 on 5 of 6), the faithful megakernel 0 (bitwise the recipe); one extra rounding
# 5.9e-4 to 3.5e-3 (a K/V slot, the residual, a matmul output in bf16), past 4x the orders on 6 of 6 prompts each.
# Spread over builtin's lengths instead (up to 1,080 tokens) the orders reached 2e-4 to 4e-4 on 4 of 6 and two of
# the three faults stayed inside. From layer 1 on the recipe's own chaos grows: the check is decided in the first
# layers. mini-llama: orders below 1e-7, faults 7e-4 to 1e-2.
FACTOR = 4.0
FLOOR = 1e-5  # 10x the orders' usual layer-0 spread (1e-6), 59x under the smallest fault measured (5.9e-4)
MAJORITY = 0.5

UNDECLARED = ("bf16 recipe: the engine declares none (engines.base.Recipe), so bf16 is judged against float32 and "
              "the reference's default recipe only: one extra rounding that stays within bf16's distance from "
              "float32 (a matmul output or a K/V slot left in bf16) is not visible to that")


def median_error(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """[..., L]: median over the last (hidden) axis of |got - want|, over the mean |want| of that layer."""
    return np.median(np.abs(got - want), axis=-1) / np.maximum(np.abs(want).mean(axis=-1), 1e-30)


def pick(lengths: list[int], n: int = TAP_PROMPTS) -> list[int]:
    """The n shortest prompts' indices (TAP_PROMPTS says why), in the run's order."""
    return sorted(sorted(range(len(lengths)), key=lambda i: (lengths[i], i))[:n])


def check(eng, model, prompts: list[tuple[str, list[int]]], ref_tokens: list[list[int]], recipe, orders,
          budget: int, progress: Callable[[str], None] = lambda s: None) -> dict:
    """eng in bf16 against recipe (the reference built in eng's declared recipe) on up to TAP_PROMPTS of prompts
    ((id, ids)), each with the reference's greedy tokens (budget long); orders: witness.OrderSpread of the same
    recipe (its judge(seed)). notes: what to say; blocks: whether they keep a PASS off."""
    if eng.recipe is None:
        return {"checked": False, "declared": None, "notes": [UNDECLARED], "blocks": False}
    declared = eng.recipe.describe()
    if not eng.capabilities.taps:
        why = ("bf16 recipe check: the engine declares a recipe but exposes no per-layer taps, so one extra rounding "
               "inside bf16's distance from float32 cannot be seen")
        return {"checked": False, "declared": declared, "notes": [why], "blocks": True}
    D = min(TAP_DECODED, budget - 1)
    idx = pick([len(ids) for _, ids in prompts])
    ctxs = [list(prompts[i][1]) + list(ref_tokens[i][:D + 1]) for i in idx]  # the tapped step feeds ctx[-1]
    progress(f"diff: bf16 recipe check ({len(idx)} prompts, taps after {D} decode steps)")
    got = eng.step_taps([c[:-1] for c in ctxs], [c[-1] for c in ctxs], decoded=D)  # [P, L, D]
    want = np.stack([recipe.score([c], want_taps=True)[0].taps[:, -1] for c in ctxs])
    spread = []
    try:
        for seed in ORDER_SEEDS:
            other = orders.judge(seed)
            t = np.stack([other.score([c], want_taps=True)[0].taps[:, -1] for c in ctxs])
            back = np.empty_like(t)
            back[..., hidden_permutation(model.config, seed)] = t  # the permuted model's stream, in the original order
            spread.append(median_error(back, want))
    except ModelError as e:
        why = f"bf16 recipe check: the other reduction orders could not be built ({e})"
        return {"checked": False, "declared": declared, "notes": [why], "blocks": True}
    return judge(median_error(got, want), np.stack(spread), declared, [prompts[i][0] for i in idx], D)


def judge(engine_err: np.ndarray, order_err: np.ndarray, declared: dict, prompt_ids: list[str], decoded: int) -> dict:
    """engine_err [P, L], order_err [S, P, L] (median_error): FAIL at the first layer where the engine passes
    max(FACTOR x the orders' largest on that prompt there, FLOOR) on more than MAJORITY of the prompts."""
    bound = np.maximum(FACTOR * order_err.max(axis=0), FLOOR)  # [P, L]
    over = engine_err > bound
    share = over.mean(axis=0)  # [L]
    layers = np.flatnonzero(share > MAJORITY)
    first = None
    if layers.size:
        layer = int(layers[0])
        p = int(np.argmax(engine_err[:, layer] / bound[:, layer]))
        first = {"layer": layer, "prompts_over": int(over[:, layer].sum()), "prompt": prompt_ids[p],
                 "engine": float(engine_err[p, layer]), "bound": float(bound[p, layer]),
                 "orders_max": float(order_err[:, p, layer].max())}
    return {"checked": True, "ok": first is None, "declared": declared, "prompts": prompt_ids,
            "decoded_steps": decoded, "factor": FACTOR, "floor": FLOOR, "majority": MAJORITY,
            "order_seeds": list(ORDER_SEEDS), "share_over_per_layer": [float(x) for x in share],
            "engine_per_prompt_layer0": [float(x) for x in engine_err[:, 0]],
            "orders_per_prompt_layer0": [float(x) for x in order_err[:, :, 0].max(axis=0)],
            "first_over": first, "notes": [], "blocks": False}
