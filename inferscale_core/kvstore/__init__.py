"""The KV store: per-entry K/V files on disk, cached in host RAM and a device pool.

``store`` holds :class:`KVStore`; ``tiers`` the memory tiers it manages; ``entry_file`` the
on-disk format every process reads (the contract between the encoder and vLLM's connector);
``head_shards`` the parts tensor-parallel ranks write, joined into whole entries.
"""

from inferscale_core.kvstore.entry_file import (
    EntryCorruptError,
    EntryHeader,
    EntryMissingError,
    FingerprintMismatchError,
    StoreFullError,
)
from inferscale_core.kvstore.store import (
    KVStore,
    PrefetchReport,
    StoreStats,
    TierStats,
)

__all__ = [
    "EntryCorruptError",
    "EntryHeader",
    "EntryMissingError",
    "FingerprintMismatchError",
    "KVStore",
    "PrefetchReport",
    "StoreFullError",
    "StoreStats",
    "TierStats",
]
