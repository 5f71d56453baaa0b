"""Durable store of pre-RoPE KV entries: one safetensors file per entry.

The vLLM connector opens this store from a plain path in each process it runs in (DESIGN.md §6):
its scheduler side reads only headers (token ids, fingerprint, shape), its worker side reads
tensors. Writes are atomic (temporary file, fsync, rename): a reader never sees half an entry.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from inferscale_core.types import FactKV

FORMAT = "inferscale-kv/1"


class EntryMissingError(KeyError):
    """No entry with that key in the store."""


@dataclass(frozen=True, slots=True)
class EntryHeader:
    """What the scheduler needs to decide whether an entry can be injected."""

    key: str
    token_ids: tuple[int, ...]
    fingerprint: str
    shape: tuple[int, int, int, int]  # [layers, tokens, kv_heads, head_dim]


class KVStore:
    """Entries in ``root/<key>.safetensors``, with small in-memory caches."""

    def __init__(self, root: Path | str, cache_bytes: int = 1 << 30) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.cache_bytes = cache_bytes
        self._headers: dict[str, EntryHeader] = {}
        self._tensors: OrderedDict[str, FactKV] = OrderedDict()
        self._cached_bytes = 0
        self._lock = threading.Lock()

    def path(self, key: str) -> Path:
        if not key or "/" in key or key.startswith("."):
            raise ValueError(f"invalid entry key {key!r}")
        return self.root / f"{key}.safetensors"

    def put(self, entry: FactKV) -> Path:
        """Write an entry durably; replaces an entry with the same key."""
        target = self.path(entry.key)
        tensors = {"k": entry.k.contiguous(), "v": entry.v.contiguous()}
        metadata = {
            "format": FORMAT,
            "fingerprint": entry.fingerprint,
            "token_ids": json.dumps(list(entry.token_ids)),
        }
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".tmp-", suffix=".safetensors")
        os.close(fd)
        try:
            save_file(tensors, tmp, metadata=metadata)
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        with self._lock:
            self._headers[entry.key] = EntryHeader(
                entry.key, tuple(entry.token_ids), entry.fingerprint, tuple(entry.k.shape)
            )
            self._remember(entry)  # write-through: the injection right after needs it
        return target

    def has(self, key: str) -> bool:
        return key in self._headers or self.path(key).exists()

    def header(self, key: str) -> EntryHeader:
        cached = self._headers.get(key)
        if cached is not None:
            return cached
        path = self.path(key)
        if not path.exists():
            raise EntryMissingError(key)
        with safe_open(str(path), framework="pt") as fh:
            meta = fh.metadata() or {}
            shape = tuple(fh.get_slice("k").get_shape())
        if meta.get("format") != FORMAT:
            raise ValueError(f"{path} is not an {FORMAT} entry")
        header = EntryHeader(
            key,
            tuple(json.loads(meta["token_ids"])),
            meta["fingerprint"],
            shape,  # type: ignore[arg-type]
        )
        self._headers[key] = header
        return header

    def get(self, key: str) -> FactKV:
        with self._lock:
            entry = self._tensors.get(key)
            if entry is not None:
                self._tensors.move_to_end(key)
                return entry
        header = self.header(key)
        with safe_open(str(self.path(key)), framework="pt") as fh:
            k = fh.get_tensor("k")  # [layers, tokens, kv_heads, head_dim]
            v = fh.get_tensor("v")  # [layers, tokens, kv_heads, head_dim]
        entry = FactKV(key, list(header.token_ids), k, v, header.fingerprint)
        with self._lock:
            self._remember(entry)
        return entry

    def delete(self, key: str) -> bool:
        """Remove an entry; True if a file was removed."""
        with self._lock:
            self._drop_cached(key)
            self._headers.pop(key, None)
        try:
            self.path(key).unlink()
            return True
        except FileNotFoundError:
            return False

    def keys(self) -> list[str]:
        return sorted(p.stem for p in self.root.glob("*.safetensors") if not p.name.startswith("."))

    def _remember(self, entry: FactKV) -> None:
        self._drop_cached(entry.key)
        if entry.nbytes > self.cache_bytes:
            return
        self._tensors[entry.key] = entry
        self._cached_bytes += entry.nbytes
        while self._cached_bytes > self.cache_bytes:
            _, old = self._tensors.popitem(last=False)
            self._cached_bytes -= old.nbytes

    def _drop_cached(self, key: str) -> None:
        old = self._tensors.pop(key, None)
        if old is not None:
            self._cached_bytes -= old.nbytes


_SHARED: dict[Path, KVStore] = {}
_SHARED_LOCK = threading.Lock()


def open_shared(root: Path | str, cache_bytes: int = 1 << 30) -> KVStore:
    """The process's one :class:`KVStore` for ``root`` (created on first use).

    When the encoder and vLLM's connector live in one process (the desktop app), they share
    memory caches through this, so a fact encoded a moment ago is injected without a disk read.
    In separate processes each opens its own; the files are the contract.
    """
    key = Path(root).resolve()
    with _SHARED_LOCK:
        store = _SHARED.get(key)
        if store is None:
            store = _SHARED[key] = KVStore(key, cache_bytes=cache_bytes)
        return store


def stack_entries(entries: list[FactKV]) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenate entries along tokens: k, v each [layers, sum(tokens), kv_heads, head_dim]."""
    return torch.cat([e.k for e in entries], dim=1), torch.cat([e.v for e in entries], dim=1)
