"""``bench.tier_capacity``: facts the real tiers hold, per stored dtype."""

from bench.tier_capacity import SHAPES, capacity


def test_compressed_entries_fill_the_tiers_with_more_facts():
    held = {
        s: capacity(s, SHAPES["smollm2"], 30, pool_bytes=64 << 20, host_bytes=128 << 20)
        for s in ("model", "fp8", "int4")
    }
    for cell in held.values():  # the pool's regions are the entry's tensors, each aligned
        assert cell["pool_region_bytes"] >= cell["entry_bytes"]
        assert cell["pool_facts"] == (64 << 20) // cell["pool_region_bytes"]
        assert cell["host_facts"] == (128 << 20) // cell["entry_bytes"]
    # fp32 on the CPU engine: fp8 ~3.7x, int4 ~7x the facts
    assert held["fp8"]["pool_facts"] > 3 * held["model"]["pool_facts"]
    assert held["int4"]["pool_facts"] > 6 * held["model"]["pool_facts"]
