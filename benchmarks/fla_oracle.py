"""flash-linear-attention's naive recurrences as the unit oracle of the reference's delta rule (GDN and KDA).

Runs in the side environment only (.venv-hf, `bash benchmarks/install_hf.sh`: torch, einops, and fla-core 0.6.0 in
.venv-hf/fla, apart from site-packages so that transformers does not pick up its Triton kernels). Only fla's two
naive modules are loaded, by file: they need torch and einops, not Triton or a GPU. On seeded random inputs (q and k
L2-normalised as the layers feed them, beta in (0, 1), log decays in (-5, 0) as K3's bounded gate gives them, a random
initial state) it writes fla's outputs and final states, recurrent and chunked, to tests/engines/oracle/fla-delta-rule
.npz with the inputs; tests/engines/reference/test_gdn.py checks the reference against them without torch.

    .venv-hf/bin/python benchmarks/fla_oracle.py
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
FLA = ROOT / ".venv-hf" / "fla"
SEED = 20261205
# B rows, T tokens (two chunks of CHUNK: fla's naive chunked KDA needs whole chunks), heads H, key dim K, value dim
# V (ARCHITECTURES.md section 6's unit sizes: KDA 2 x 8; GDN's key heads are expanded before the rule: H value heads)
B, T, H, K, V, CHUNK = 2, 32, 3, 8, 8, 16


def load(relative: str):
    """One fla module by file, without fla/__init__ (which imports Triton)."""
    path = FLA / "fla" / "ops" / relative
    if not path.is_file():
        sys.exit(f"error: {path} missing; run: bash benchmarks/install_hf.sh")
    spec = importlib.util.spec_from_file_location(relative.replace("/", "_")[:-3], path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> int:
    gdn = load("gated_delta_rule/naive.py")
    kda = load("kda/naive.py")
    rng = np.random.default_rng(SEED)

    def l2(x):
        return x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)

    q, k = l2(rng.standard_normal((B, T, H, K))), l2(rng.standard_normal((B, T, H, K)))
    v = rng.standard_normal((B, T, H, V))
    beta = 1.0 / (1.0 + np.exp(-rng.standard_normal((B, T, H))))
    g_head = -5.0 / (1.0 + np.exp(-rng.standard_normal((B, T, H))))  # GDN: one log decay per head
    g_chan = -5.0 / (1.0 + np.exp(-rng.standard_normal((B, T, H, K))))  # KDA: one per key channel
    S0 = 0.5 * rng.standard_normal((B, H, K, V))
    arrays = {k_: a.astype(np.float32) for k_, a in dict(q=q, k=k, v=v, beta=beta, g_head=g_head, g_chan=g_chan,
                                                          S0=S0).items()}
    t = {k_: torch.from_numpy(a) for k_, a in arrays.items()}
    scale = K ** -0.5
    out = dict(arrays)
    o, S = gdn.naive_recurrent_gated_delta_rule(t["q"], t["k"], t["v"], t["beta"], t["g_head"], scale=scale,
                                                initial_state=t["S0"], output_final_state=True)
    out.update(gdn_o=o.numpy(), gdn_S=S.numpy())
    o, S = gdn.naive_chunk_gated_delta_rule(t["q"], t["k"], t["v"], t["g_head"], t["beta"], chunk_size=CHUNK,
                                            scale=scale, initial_state=t["S0"], output_final_state=True)
    out.update(gdn_chunk_o=o.numpy(), gdn_chunk_S=S.numpy())
    o, S = kda.naive_recurrent_kda(t["q"], t["k"], t["v"], t["g_chan"], t["beta"], scale=scale,
                                   initial_state=t["S0"], output_final_state=True)
    out.update(kda_o=o.numpy(), kda_S=S.numpy())
    o, S = kda.naive_chunk_kda(t["q"], t["k"], t["v"], t["g_chan"], t["beta"], scale=scale, initial_state=t["S0"],
                               output_final_state=True, chunk_size=CHUNK)
    out.update(kda_chunk_o=o.numpy(), kda_chunk_S=S.numpy())
    dest = ROOT / "tests" / "engines" / "oracle" / "fla-delta-rule.npz"
    meta = {"seed": SEED, "scale": scale, "chunk": CHUNK, "torch": torch.__version__, "fla-core": fla_version()}
    np.savez_compressed(dest, meta=np.array(json.dumps(meta)),
                        **{k_: np.asarray(a, np.float32) for k_, a in out.items()})
    for name in ("gdn", "kda"):
        d = max(float(np.abs(out[f"{name}_o"] - out[f"{name}_chunk_o"]).max()),
                float(np.abs(out[f"{name}_S"] - out[f"{name}_chunk_S"]).max()))
        print(f"{name}: fla's recurrent vs chunked form: max |Δ| {d:.1e}")
    print(f"wrote {dest.relative_to(ROOT)} ({dest.stat().st_size / 1e3:.0f} kB), {json.dumps(meta)}")
    return 0


def fla_version() -> str:
    found = sorted(FLA.glob("fla_core-*.dist-info"))
    return found[0].name[len("fla_core-"):-len(".dist-info")] if found else "unknown"


if __name__ == "__main__":
    sys.exit(main())
