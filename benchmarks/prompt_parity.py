"""Are evalsuite's prompts lm-eval's own? Renders lm-eval's task definitions (gsm8k 5-shot, gsm8k_cot,
gpqa_diamond_zeroshot, gpqa_diamond_cot_zeroshot) and evalsuite's (evalsuite_gsm8k, evalsuite_gsm8k_cot,
evalsuite_gpqa_mc, evalsuite_gpqa_cot) on the same real items (../shared/data, read-only) through
lm-eval's own Task API, as `simple_evaluate` would (random seed 0, few-shot seed 1234), and compares
every request (context, continuations, generation settings) character for character.

GPQA's answer order is the one difference by design (lm-eval shuffles with the process-wide random
state, evalsuite per question from its Record ID): for those items evalsuite's template is rendered
again with lm-eval's order and must then be identical; the count of items whose order differs is
printed.

Prints counts and the KIND and offset of each difference, never item text (GPQA's questions must not
appear in logs). Figures, not assertions:

    .venv/bin/python -m benchmarks.prompt_parity --data ../shared/data [--limit N]
"""

from __future__ import annotations

import argparse
import random
import re
import shutil
import tempfile
from collections import Counter
from importlib.resources import files
from pathlib import Path

import yaml

LM_EVAL_TASKS = Path(str(files("lm_eval"))) / "tasks"


class _Loader(yaml.SafeLoader):
    pass


_Loader.add_constructor("!function", lambda loader, node: "!function " + loader.construct_scalar(node))


def _dump(doc: dict, path: Path) -> None:
    text = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=1 << 20)
    path.write_text(re.sub(r"'!function ([^']+)'", r"!function \1", text))


def lm_eval_copy(src_dir: str, names: list[str], dst: Path, data: dict, kind: str) -> None:
    """lm-eval's own YAMLs (and helpers) with only the data source changed to the local files."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in (LM_EVAL_TASKS / src_dir).iterdir():
        if f.suffix == ".py":
            shutil.copy(f, dst / f.name)
    for name in names:
        doc = yaml.load((LM_EVAL_TASKS / src_dir / name).read_text(), Loader=_Loader)
        if "dataset_path" in doc or name.startswith("_"):
            doc["dataset_path"] = kind
            doc["dataset_kwargs"] = {"data_files": data}
        doc.pop("dataset_name", None)
        _dump(doc, dst / name)


def requests(task_name: str, include: Path, limit: int | None):
    """(task, {doc_id: [request args]}, {doc_id: doc}) as simple_evaluate builds them."""
    from lm_eval.tasks import TaskManager, get_task_dict

    random.seed(0)  # simple_evaluate seeds the global state before building tasks (lm-eval's GPQA shuffles with it)
    task = get_task_dict([task_name], TaskManager(include_path=str(include), include_defaults=False))[task_name]
    task.set_fewshot_seed(seed=1234)
    task.build_all_requests(limit=limit, rank=0, world_size=1)
    out: dict[int, list] = {}
    docs: dict[int, dict] = {}
    for inst in task.instances:
        out.setdefault(inst.doc_id, []).append(inst.args)
        docs[inst.doc_id] = inst.doc
    return task, out, docs


CHOICES = ("choice1", "choice2", "choice3", "choice4")


def reorder(ours, theirs) -> dict:
    """evalsuite's requests with each GPQA item rendered again in lm-eval's answer order (only where the
    four answers are the same strings); prints how many items' order differed."""
    task, reqs, docs = ours
    _, _, their_docs = theirs
    moved = same_set = 0
    out = {}
    for doc_id, args in reqs.items():
        d, t = docs[doc_id], their_docs.get(doc_id)
        if t is None or [d[c] for c in CHOICES] == [t[c] for c in CHOICES]:
            out[doc_id] = args
            continue
        moved += 1
        if sorted(d[c] for c in CHOICES) != sorted(t[c] for c in CHOICES):
            out[doc_id] = args  # not the same answers: compared as they are (and reported as different)
            continue
        same_set += 1
        ctx = task.doc_to_text({**d, **{c: t[c] for c in CHOICES}})
        out[doc_id] = [(ctx, *a[1:]) for a in args]
    print(f"  answer order differs (by design) on {moved} of {len(reqs)} items; "
          f"same four answers on {same_set} of them")
    return out


def kind_of(a: str, b: str) -> str:
    if a == b:
        return "identical"
    if re.sub(r"\s+", "", a) == re.sub(r"\s+", "", b):
        return "whitespace only"
    if sorted(a) == sorted(b):
        return "same characters, other order (answer order)"
    return "different text"


def compare(label: str, ours: dict, theirs: dict) -> int:
    """Prints the comparison; returns the number of items whose requests are not all identical."""
    kinds, firsts, rest = Counter(), [], Counter()
    for doc_id in sorted(set(ours) & set(theirs)):
        a, b = ours[doc_id][0][0], theirs[doc_id][0][0]
        k = kind_of(a, b)
        kinds[k] += 1
        if k != "identical" and len(firsts) < 5:
            at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            firsts.append(f"doc {doc_id}: first difference at character {at} of {len(a)}/{len(b)}")
        # every other part of every request: continuations (multiple choice) or generation settings
        same = [x[1:] for x in ours[doc_id]] == [y[1:] for y in theirs[doc_id]]
        rest["identical" if same else "different"] += 1
    only = len(set(ours) ^ set(theirs))
    print(f"{label}: {sum(kinds.values())} items compared ({only} in one only); contexts: {dict(kinds)}; "
          f"continuations / generation settings: {dict(rest)}")
    for f in firsts:
        print(f"  {f}")
    return only + sum(v for k, v in kinds.items() if k != "identical") + rest["different"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="../shared/data")
    ap.add_argument("--limit", type=int, default=None)
    args = ap.parse_args()
    from evalsuite.bench.data import offline, resolve
    from evalsuite.bench.run import resolve_tasks

    offline()
    d = Path(args.data).resolve()
    tmp = Path(tempfile.mkdtemp(prefix="evalsuite-parity-"))
    gsm = {"train": str(d / "gsm8k" / "train.jsonl"), "test": str(d / "gsm8k" / "test.jsonl")}
    lm_eval_copy("gsm8k", ["gsm8k.yaml", "gsm8k-cot.yaml"], tmp / "lm" / "gsm8k", gsm, "json")
    gpqa = {"train": str(d / "gpqa" / "gpqa_diamond.csv")}
    lm_eval_copy("gpqa/zeroshot", ["_gpqa_zeroshot_yaml", "gpqa_diamond_zeroshot.yaml"], tmp / "lm" / "gpqa", gpqa,
                 "csv")
    lm_eval_copy("gpqa/cot_zeroshot", ["_gpqa_cot_zeroshot_yaml", "gpqa_diamond_cot_zeroshot.yaml"],
                 tmp / "lm" / "gpqa-cot", gpqa, "csv")
    ours_g = resolve_tasks("gsm8k", resolve("gsm8k", str(d)), tmp / "ours-gsm8k")
    ours_q = resolve_tasks("gpqa", resolve("gpqa", str(d)), tmp / "ours-gpqa")
    bad = compare("gsm8k 5-shot (evalsuite_gsm8k vs lm-eval gsm8k)",
                  requests("evalsuite_gsm8k", ours_g, args.limit)[1],
                  requests("gsm8k", tmp / "lm" / "gsm8k", args.limit)[1])
    bad += compare("gsm8k 8-shot CoT (evalsuite_gsm8k_cot vs lm-eval gsm8k_cot)",
                   requests("evalsuite_gsm8k_cot", ours_g, args.limit)[1],
                   requests("gsm8k_cot", tmp / "lm" / "gsm8k", args.limit)[1])
    for ours_name, theirs_name, folder in (("evalsuite_gpqa_mc", "gpqa_diamond_zeroshot", "gpqa"),
                                           ("evalsuite_gpqa_cot", "gpqa_diamond_cot_zeroshot", "gpqa-cot")):
        theirs = requests(theirs_name, tmp / "lm" / folder, args.limit)
        ours = requests(ours_name, ours_q, args.limit)
        label = f"gpqa diamond ({ours_name} vs lm-eval {theirs_name})"
        print(f"{label}, as built:")
        compare("  as built", ours[1], theirs[1])
        bad += compare("  in lm-eval's answer order", reorder(ours, theirs), theirs[1])
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"items with any difference beyond the answer order: {bad}")
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
