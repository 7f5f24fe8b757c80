"""A speculative engine's own figures (Engine.run_stats()["speculation"]) in one report line: reported, never judged
(the verdict rests on the tokens and logprobs, and on the accept branches the run drove: coverage.py)."""

from __future__ import annotations


def text(sp: dict) -> str:
    if not sp.get("target_steps"):
        return f"speculation ({sp.get('drafter')} drafts): no target step ran"
    rates = ", ".join(f"{x:.2f}" for x in sp["acceptance_rate_by_position"])
    return (f"speculation ({sp['drafter']} drafts, {sp.get('target')} verifies, block {sp['block']}): acceptance "
            f"length {sp['acceptance_length']:.2f} tokens a target step, acceptance rate by draft position [{rates}], "
            f"{sp['target_steps']} target steps for {sp['tokens_committed']} tokens")
