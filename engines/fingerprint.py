"""What an in-process engine IS, for reuse decisions (engines.base re-exports it)."""

from __future__ import annotations

import hashlib
from pathlib import Path


def source_fingerprint(package_dir, spec: dict) -> str:
    """What an in-process engine IS, for reuse decisions: sha256 over the engine's own source files
    (its package and the shared engines/*.py it runs on), the jax/jaxlib versions and its static spec
    (dtype, fault, tile sizes...). Changing one line of the kernel changes it."""
    import json
    from importlib.metadata import version

    h = hashlib.sha256()
    shared = Path(__file__).resolve().parent
    for f in sorted(Path(package_dir).glob("*.py")) + sorted(shared.glob("*.py")):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    h.update(json.dumps({"jax": version("jax"), "jaxlib": version("jaxlib"), "spec": spec},
                        sort_keys=True, default=str).encode())
    return h.hexdigest()
