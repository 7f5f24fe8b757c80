"""Engines: things that turn token ids into logits. evalsuite judges them through engines.base."""
