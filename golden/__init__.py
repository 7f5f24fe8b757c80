"""Golden outputs of the float32 reference (package data: read through importlib.resources)."""
