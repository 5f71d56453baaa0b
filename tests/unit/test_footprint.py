"""What memory takes (``memory stats``, the F4 line): real fact log, real store files."""

import torch

from inferscale_core.config import AppConfig
from inferscale_core.factlog import FactLog
from inferscale_core.footprint import footprint, summary
from inferscale_core.kvstore import KVStore
from inferscale_core.types import FactKV


def _entry(key: str, tokens: int = 8) -> FactKV:
    k = torch.randn(2, tokens, 2, 64, generator=torch.Generator().manual_seed(len(key)))
    return FactKV(key, list(range(tokens)), k, -k, "fp")  # [layers, tokens, heads, dim]


def test_footprint_counts_entries_per_dtype_tiers_and_deferred(tmp_path):
    kv_root = tmp_path / "kv"
    store = KVStore(kv_root / "fp", host_bytes=1 << 20, fingerprint="fp", store_dtype="model")
    with FactLog.open(tmp_path / "memory.db") as log:
        pid = log.profile("default")
        ids = [log.add_fact(pid, f"Fact number {i} about a red kite.")[0] for i in range(4)]
        for i, scheme in zip(ids[:3], ("model", "int4", "int4"), strict=True):
            entry = _entry(f"fact-{i}")
            store.put(entry, scheme=scheme)
            nbytes = store.header(entry.key).nbytes
            log.record_kv(i, "fp", 0, "v", entry.key, 8, nbytes)
        log.defer_kv([ids[3]], "import")
        store.get("fact-" + str(ids[1]))  # now held in host RAM
        config = AppConfig(kv_disk_budget="off")
        report = footprint(log, pid, kv_root, config, store)
    assert report["facts"] == 4 and report["deferred_facts"] == 1
    assert report["deferred_by_reason"] == {"import": 1}
    (model,) = report["models"]
    assert model["entries"] == 3 and model["budget_bytes"] is None
    assert {s: c["entries"] for s, c in model["by_dtype"].items()} == {"int4": 2, "model": 1}
    assert model["disk_bytes"] == sum(p.stat().st_size for p in (kv_root / "fp").iterdir())
    assert report["tiers"]["host"]["entries"] >= 1 and report["tiers"]["disk"]["entries"] == 3
    line = summary(report)
    assert line.startswith("4 memories · KV ") and "(int4 2, model 1; no budget)" in line
    assert "host " in line and "1 encoded when first asked about" in line


def test_one_memory_is_singular(tmp_path):
    with FactLog.open(tmp_path / "memory.db") as log:
        pid = log.profile("default")
        log.add_fact(pid, "My sister Ines moved to Lisbon in March 2024.")
        report = footprint(log, pid, tmp_path / "kv", AppConfig())
    assert summary(report).startswith("1 memory · KV 0 B on disk (none yet; budget auto)")
