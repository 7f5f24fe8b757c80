"""The engine under test: every layer of a decode step in one Pallas call (see kernel.py)."""

from engines.megakernel.engine import FAULTS, MegakernelEngine

__all__ = ["FAULTS", "MegakernelEngine"]
