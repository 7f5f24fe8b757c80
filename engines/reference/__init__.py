"""The reference engine: a pure-JAX decoder written for clarity. It is the judge."""

from engines.reference.engine import ReferenceEngine

__all__ = ["ReferenceEngine"]
