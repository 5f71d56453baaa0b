"""How many facts a GPU pool and a host-RAM tier hold, per stored dtype: measured by filling
the real tiers (``DeviceTier``'s allocator and alignment, ``HostTier``'s byte budget) with
entries of one model shape until the first eviction.

``python -m bench.tier_capacity [--pool-gib 2] [--host-gib 4] [--tokens 49] [--shape 8b]``
prints one JSON object. The device tier runs on the CPU here (same allocator, same regions; only
the copies differ), so no GPU is needed; the entries are random, in the model's dtype, then
stored as each scheme (:func:`inferscale_core.kvstore.quant.quantize`).
"""

from __future__ import annotations

import argparse
import json

import torch

from inferscale_core.kvstore.quant import quantize
from inferscale_core.kvstore.tiers import DeviceTier, HostTier
from inferscale_core.types import FactKV

# (layers, kv_heads, head_dim, dtype) of the shapes the benches use
SHAPES = {
    "8b": (32, 8, 128, torch.bfloat16),  # Llama-3.1-8B
    "smollm2": (30, 3, 64, torch.float32),  # SmolLM2-135M on the CPU engine
}


def _entry(key: str, tokens: int, shape: tuple, gen: torch.Generator) -> FactKV:
    layers, heads, dim, dtype = shape
    k = torch.randn(layers, tokens, heads, dim, generator=gen).to(dtype)
    return FactKV(key, list(range(tokens)), k, k.clone(), "fp")


def capacity(
    scheme: str, shape: tuple, tokens: int, pool_bytes: int, host_bytes: int
) -> dict[str, float]:
    """Facts of ``tokens`` tokens the tiers hold when stored as ``scheme``."""
    gen = torch.Generator().manual_seed(0)
    one = quantize(_entry("probe", tokens, shape, gen), scheme)
    # One region's size decides the pool's count (every entry has the same shape): place
    # entries into a pool of a few regions to check the arithmetic, then count for the budget.
    probe = DeviceTier(8 * DeviceTier(0, "cpu").region_size(one), "cpu")
    placed = 0
    while probe.place(quantize(_entry(f"f{placed}", tokens, shape, gen), scheme), set(), _drop):
        placed += 1
        if len(probe) < placed:  # the first eviction: the pool is full
            break
    region = probe.region_size(one)
    assert len(probe) == probe.budget // region, (len(probe), probe.budget, region)
    host = HostTier(host_bytes, pin=False)
    return {
        "entry_bytes": one.nbytes,
        "pool_region_bytes": region,
        "pool_facts": DeviceTier(pool_bytes, "cpu").budget // region,
        "host_facts": host.budget // one.nbytes,
    }


def _drop(key: str, views: FactKV) -> None:
    """Eviction's demotion: the capacity count needs nothing kept."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pool-gib", type=float, default=2.0)
    parser.add_argument("--host-gib", type=float, default=4.0)
    parser.add_argument("--tokens", type=int, default=49, help="tokens a fact (LoCoMo's mean: 49)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="8b")
    args = parser.parse_args()
    pool, host = int(args.pool_gib * (1 << 30)), int(args.host_gib * (1 << 30))
    shape = SHAPES[args.shape]
    out = {"shape": args.shape, "tokens": args.tokens, "pool_gib": args.pool_gib}
    out["host_gib"] = args.host_gib
    out["schemes"] = {
        s: capacity(s, shape, args.tokens, pool, host) for s in ("model", "fp8", "int4")
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
