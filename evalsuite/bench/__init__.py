"""Benchmark runs over lm-eval and their paired statistics (issue 5; statistics first)."""
