"""The speculative-decoding engine (`--engine spec`): drafts verified by a target in one multi-token step, accepted
greedily; its committed stream must be the target's plain greedy stream."""

from engines.spec.engine import SpeculativeEngine

__all__ = ["SpeculativeEngine"]
