"""GSM8K helpers for the task YAMLs (loaded by lm-eval through `!function`)."""

from __future__ import annotations

from functools import cache
from importlib.resources import files

import yaml


@cache
def cot_exemplars() -> list[dict]:
    """The 8 chain-of-thought exemplars (Wei et al. 2022) of lm-eval's own `gsm8k_cot`, read from the
    installed lm-eval's gsm8k-cot.yaml rather than copied: the prompt is theirs by construction."""
    path = files("lm_eval") / "tasks" / "gsm8k" / "gsm8k-cot.yaml"
    samples = yaml.safe_load(path.read_text())["fewshot_config"]["samples"]
    return [{"question": s["question"], "target": s["target"]} for s in samples]
