"""Are evalsuite's prompts lm-eval's own? Renders lm-eval's task definitions (gsm8k 5-shot,
gpqa_diamond_zeroshot) and evalsuite's (evalsuite_gsm8k, evalsuite_gpqa_mc) on the same real items
(../shared/data, read-only) through lm-eval's own Task API, as `simple_evaluate` would (random seed 0,
few-shot seed 1234), and compares every request character for character.

Prints counts and the KIND and offset of each difference, never item text (GPQA's questions must not
appear in logs). Figures, not assertions:

    .venv/bin/python benchmarks/prompt_parity.py --data ../shared/data [--limit N]
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


def requests(task_name: str, include: Path, limit: int | None) -> dict[int, list]:
    from lm_eval.tasks import TaskManager, get_task_dict

    random.seed(0)  # simple_evaluate seeds the global state before building tasks (lm-eval's GPQA shuffles with it)
    task = get_task_dict([task_name], TaskManager(include_path=str(include), include_defaults=False))[task_name]
    task.set_fewshot_seed(seed=1234)
    task.build_all_requests(limit=limit, rank=0, world_size=1)
    out: dict[int, list] = {}
    for inst in task.instances:
        out.setdefault(inst.doc_id, []).append(inst.args)
    return out


def kind_of(a: str, b: str) -> str:
    if a == b:
        return "identical"
    if re.sub(r"\s+", "", a) == re.sub(r"\s+", "", b):
        return "whitespace only"
    if sorted(a) == sorted(b):
        return "same characters, other order (answer order)"
    return "different text"


def compare(label: str, ours: dict, theirs: dict) -> None:
    kinds, firsts, gen = Counter(), [], Counter()
    for doc_id in sorted(set(ours) & set(theirs)):
        a, b = ours[doc_id][0][0], theirs[doc_id][0][0]
        k = kind_of(a, b)
        kinds[k] += 1
        if k != "identical" and len(firsts) < 5:
            at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            firsts.append(f"doc {doc_id}: first difference at character {at} of {len(a)}/{len(b)}")
        if len(ours[doc_id][0]) > 1 and isinstance(ours[doc_id][0][1], dict):
            gen["identical" if ours[doc_id][0][1] == theirs[doc_id][0][1] else "different"] += 1
    print(f"{label}: {sum(kinds.values())} items; contexts: {dict(kinds)}")
    for f in firsts:
        print(f"  {f}")
    if gen:
        print(f"  generation settings (until, max_gen_toks, ...): {dict(gen)}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="../shared/data")
    ap.add_argument("--limit", type=int, default=None)
    args = ap.parse_args()
    from evalsuite.bench.data import offline
    from evalsuite.bench.run import _resolve_tasks

    offline()
    d = Path(args.data).resolve()
    tmp = Path(tempfile.mkdtemp(prefix="evalsuite-parity-"))
    gsm = {"train": str(d / "gsm8k" / "train.jsonl"), "test": str(d / "gsm8k" / "test.jsonl")}
    lm_eval_copy("gsm8k", ["gsm8k.yaml"], tmp / "lm" / "gsm8k", gsm, "json")
    lm_eval_copy("gpqa/zeroshot", ["_gpqa_zeroshot_yaml", "gpqa_diamond_zeroshot.yaml"], tmp / "lm" / "gpqa",
                 {"train": str(d / "gpqa" / "gpqa_diamond.csv")}, "csv")
    ours_g = _resolve_tasks("gsm8k", d / "gsm8k" / "test.jsonl", tmp / "ours-gsm8k")
    ours_q = _resolve_tasks("gpqa", d / "gpqa" / "gpqa_diamond.csv", tmp / "ours-gpqa")
    # our gsm8k few-shot exemplars come from tasks/data/gsm8k_fewshot.jsonl; lm-eval's from the train split
    compare("gsm8k 5-shot (evalsuite_gsm8k vs lm-eval gsm8k)", requests("evalsuite_gsm8k", ours_g, args.limit),
            requests("gsm8k", tmp / "lm" / "gsm8k", args.limit))
    compare("gpqa diamond zero-shot mc (evalsuite_gpqa_mc vs lm-eval gpqa_diamond_zeroshot)",
            requests("evalsuite_gpqa_mc", ours_q, args.limit),
            requests("gpqa_diamond_zeroshot", tmp / "lm" / "gpqa", args.limit))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
