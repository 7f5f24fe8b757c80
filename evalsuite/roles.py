"""Which declared engine plays which role, by name (the plugin loader, evalsuite/plugins.py, builds them):
the judge every other engine is compared against, and the engine under test when none is named."""

JUDGE = "reference"  # the independent float32 JAX implementation; `--against` accepts only it
DEFAULT_ENGINE = "megakernel"  # evalsuite's own fused engine: what `diff`, `verify` and `run --engine` test by default
