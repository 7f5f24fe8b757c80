"""On a TPU host: the float32 elementwise ops and matmul a kernel uses, computed by Mosaic (inside a `pallas_call`)
and by XLA on the same chip, each against float64 on the host: where the chip's two compilers round differently.

A Mosaic kernel can be farther from the reference than the reference's own rounding explains (docs/tpu.md: the
megakernel's float32 diff of mini-muse through Mosaic) if Mosaic's exp, rsqrt, division or matmul carry more error
than XLA's. This measures each op alone, on seeded inputs over the ranges the kernels feed them.

  python -m interop.tpu_ops [--out FILE] [--interpret]

--interpret runs the kernels in Pallas's interpreter (no TPU; then both sides are XLA on this CPU and agree: a
check of the script, not of a chip). Prints one line per op and writes JSON: per op the largest and 99.9th
percentile error in float32 ulps of the exact value, for Mosaic and for XLA, and the share of elements on which
they differ. Exit 2 when jax has no TPU and --interpret is not given.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

SEED = 0
SHAPE = (512, 128)


def _domains(rng) -> dict:
    """Inputs per op over the ranges the kernels use (gates, decays, norms, softmax, activations)."""
    u = lambda lo, hi: rng.uniform(lo, hi, SHAPE).astype(np.float32)  # noqa: E731
    lu = lambda lo, hi: np.exp(rng.uniform(np.log(lo), np.log(hi), SHAPE)).astype(np.float32)  # noqa: E731
    return {"exp": (u(-20, 5),), "log": (lu(1e-4, 1e4),), "rsqrt": (lu(1e-8, 1e4),), "sqrt": (lu(1e-8, 1e4),),
            "reciprocal": (lu(1e-4, 1e4),), "divide": (u(-10, 10), lu(1e-3, 1e3)), "sigmoid": (u(-20, 20),),
            "tanh": (u(-10, 10),), "silu": (u(-20, 20),), "softplus": (u(-20, 20),),
            "mean_square": (rng.standard_normal(SHAPE).astype(np.float32),)}


def _ops():
    import jax
    import jax.numpy as jnp

    return {"exp": jnp.exp, "log": jnp.log, "rsqrt": jax.lax.rsqrt, "sqrt": jnp.sqrt, "reciprocal": lambda x: 1 / x,
            "divide": lambda a, b: a / b, "sigmoid": jax.nn.sigmoid, "tanh": jnp.tanh, "silu": jax.nn.silu,
            "softplus": jax.nn.softplus,  # an RMSNorm's sum of squares, over the lanes:
            "mean_square": lambda x: jnp.broadcast_to(jnp.mean(x * x, axis=-1, keepdims=True), x.shape)}


EXACT = {"exp": np.exp, "log": np.log, "rsqrt": lambda x: 1 / np.sqrt(x), "sqrt": np.sqrt,
         "reciprocal": lambda x: 1 / x, "divide": lambda a, b: a / b, "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
         "tanh": np.tanh, "silu": lambda x: x / (1 + np.exp(-x)), "softplus": lambda x: np.logaddexp(0, x),
         "mean_square": lambda x: np.broadcast_to(np.mean(x * x, axis=-1, keepdims=True), x.shape)}


def ulps(y: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """|y - exact| in units of the float32 spacing at the exact value."""
    return np.abs(y.astype(np.float64) - exact) / np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)


def _row(name: str, mosaic: np.ndarray, xla: np.ndarray, exact: np.ndarray) -> dict:
    um, ux = ulps(mosaic, exact), ulps(xla, exact)
    return {"op": name, "mosaic_max_ulp": float(um.max()), "mosaic_p999_ulp": float(np.quantile(um, 0.999)),
            "xla_max_ulp": float(ux.max()), "xla_p999_ulp": float(np.quantile(ux, 0.999)),
            "differ_share": float(np.mean(mosaic != xla))}


def measure(interpret: bool) -> list[dict]:
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    rng, rows = np.random.default_rng(SEED), []
    for name, args in _domains(rng).items():
        fn = _ops()[name]

        def kernel(*refs, fn=fn):
            refs[-1][...] = fn(*(r[...] for r in refs[:-1]))

        call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(SHAPE, jnp.float32), interpret=interpret)
        mosaic = np.asarray(jax.jit(call)(*args))
        xla = np.asarray(jax.jit(fn)(*args))
        rows.append(_row(name, mosaic, xla, EXACT[name](*(a.astype(np.float64) for a in args))))
    a = rng.standard_normal((128, 256)).astype(np.float32)
    b = rng.standard_normal((256, 128)).astype(np.float32)

    def dot(x, y):
        return jnp.dot(x, y, preferred_element_type=jnp.float32, precision=jax.lax.Precision.HIGHEST)

    def mm_kernel(x_ref, y_ref, o_ref):
        o_ref[...] = dot(x_ref[...], y_ref[...])

    call = pl.pallas_call(mm_kernel, out_shape=jax.ShapeDtypeStruct((128, 128), jnp.float32), interpret=interpret)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    scale = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)  # the sum's magnitude: its rounding scale
    mosaic, xla = np.asarray(jax.jit(call)(a, b)), np.asarray(jax.jit(dot)(a, b))
    rows.append({"op": "matmul HIGHEST [128,256]x[256,128]",
                 "mosaic_max_rel": float((np.abs(mosaic - exact) / scale).max()),
                 "xla_max_rel": float((np.abs(xla - exact) / scale).max()),
                 "differ_share": float(np.mean(mosaic != xla)),
                 "note": "error over sum |a||b| (float32's unit roundoff is 6e-8)"})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--interpret", action="store_true", help="Pallas's interpreter instead of Mosaic (no TPU)")
    a = ap.parse_args(argv)
    if a.out and not Path(a.out).resolve().parent.is_dir():  # before the measuring, not after it
        print(f"error: --out {a.out}: no directory {Path(a.out).resolve().parent}", file=sys.stderr)
        return 2
    import jax

    platform = jax.devices()[0].platform
    if platform != "tpu" and not a.interpret:
        print(f"error: jax runs on {platform} here, not a TPU (--interpret checks the script on a CPU)",
              file=sys.stderr)
        return 2
    t0 = time.time()
    rows = measure(a.interpret)
    for r in rows:
        print(json.dumps(r))
    doc = {"benchmark": "tpu-ops", "device": str(jax.devices()[0].device_kind), "interpret": a.interpret,
           "seed": SEED, "shape": list(SHAPE), "jax": jax.__version__, "seconds": round(time.time() - t0, 1),
           "rows": rows}
    if a.out:
        with open(a.out, "w") as f:
            f.write(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
