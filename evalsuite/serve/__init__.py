"""`evalsuite serve`: request parsing (parse.py, pure), the batching worker (worker.py) and a thin
Starlette app (app.py)."""

from evalsuite.serve.app import build_app, serve

__all__ = ["build_app", "serve"]
