"""The engine under test: every layer of a decode step in one Pallas call (see kernel.py)."""

from engines.megakernel.engine import ENGINE_FAULTS, FAULTS, MegakernelEngine

__all__ = ["ENGINE_FAULTS", "FAULTS", "MegakernelEngine"]
