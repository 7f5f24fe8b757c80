"""The benchmark scripts, run from the repository root as modules: `.venv/bin/python -m benchmarks.NAME [ARGS]`.
`-m` puts the working directory first on sys.path, so a script imports the checkout's own evalsuite and engines
(and its sibling benchmarks as `benchmarks.NAME`), also from a git worktree, with no sys.path edits. Benchmarks
print figures and write JSON to benchmarks/results/; they assert nothing (the tests do). The scripts for the
side environment (.venv-hf: hf_oracle.py, hf_gguf_oracle.py, fewshot_hf.py) import nothing from evalsuite and
run there by path.
"""
