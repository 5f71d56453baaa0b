"""A store writing (and salting requests) as another ``kv_store_dtype`` for one test."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from inferscale_core.kvstore import KVStore


@contextlib.contextmanager
def store_dtype(store: KVStore, scheme: str) -> Iterator[None]:
    """``store`` writing as ``scheme`` inside the block, as before after it."""
    before = store.store_dtype
    store.store_dtype = scheme
    try:
        yield
    finally:
        store.store_dtype = before
