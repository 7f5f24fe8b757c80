"""Benchmark task definitions (lm-eval YAML) and bundled data, read through importlib.resources."""
