"""evalsuite: prove or refute "our fused engine loses no accuracy"."""

__version__ = "0.1.0"
