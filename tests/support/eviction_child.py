"""Child process for the eviction crash test: encode and evict over and over until killed.

``python tests/support/eviction_child.py DB STORE BUDGET_ENTRIES`` gives every active fact an
entry the way the memory worker does (its file written durably, then its row), then drops the
least recently used down under a budget of BUDGET_ENTRIES entries with the worker's own
:func:`~inferscale_core.memory_worker.evict_over_budget` (rows in one transaction, then the
files), takes the evicted facts out of waiting, and starts again. The parent SIGKILLs it.
"""

from __future__ import annotations

import sys
import zlib
from pathlib import Path

FINGERPRINT = "fp-eviction"
TOKENS = 6


def entry(key: str):
    import torch

    from inferscale_core.types import FactKV

    g = torch.Generator().manual_seed(zlib.crc32(key.encode()))
    k = torch.randn(2, TOKENS, 2, 16, generator=g)  # [layers, tokens, kv_heads, head_dim]
    return FactKV(key, list(range(10, 10 + TOKENS)), k, -k, FINGERPRINT)


def main(db: Path, root: Path, budget_entries: int) -> None:
    from inferscale_core.factlog import FactLog
    from inferscale_core.kvstore import KVStore
    from inferscale_core.memory_worker import evict_over_budget

    log = FactLog.open(db)
    profile = log.profile("default")
    store = KVStore(root, fingerprint=FINGERPRINT)
    budget = budget_entries * entry("probe").nbytes  # stored as is ("model")
    rounds = 0
    while True:
        for fact in log.facts_without_kv(profile, FINGERPRINT, 0, "v"):
            key = f"{profile}-{fact.id}-r{rounds}"  # a new file each round
            store.put(entry(key))  # durable before its row, as the worker writes it
            nbytes = store.header(key).nbytes
            log.record_kv(fact.id, FINGERPRINT, 0, "v", key, TOKENS, nbytes)
        evicted = evict_over_budget(log, store, budget, spare_seconds=0)
        log.want_kv(log.deferred_facts(profile))  # retrieved again: encoded next round
        rounds += 1
        print(f"round {rounds}: evicted {len(evicted)}", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))
