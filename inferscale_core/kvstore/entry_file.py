"""One KV entry on disk: a safetensors file with ``k`` and ``v`` and a small JSON header.

This format is the contract between processes (docs/DESIGN.md, "The connector"): the encoder
writes it, and vLLM's connector reads it wherever it runs — the scheduler side reads only
headers (token ids, fingerprint, shape), the worker side the tensors. Writes are atomic
(:mod:`inferscale_core.files`).
"""

from __future__ import annotations

import contextlib
import json
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import save_file

from inferscale_core.files import TEMP_PREFIX, write_atomic
from inferscale_core.types import FactKV

FORMAT = "inferscale-kv/2"  # /2: post-RoPE keys with their origin (/1 stored pre-RoPE)
SUFFIX = ".safetensors"
_STALE_TEMP_S = 3600.0  # temporary files older than this are from a crashed writer


class EntryMissingError(KeyError):
    """No entry with that key in the store."""


class FingerprintMismatchError(ValueError):
    """The entry was encoded by another model than the reader expects."""

    def __init__(self, key: str, found: str, expected: str) -> None:
        super().__init__(
            f"KV entry {key} belongs to model {found!r}, not {expected!r}; refusing to use it"
        )
        self.key, self.found, self.expected = key, found, expected


@dataclass(frozen=True, slots=True)
class EntryHeader:
    """What the scheduler needs to decide whether an entry can be injected."""

    key: str
    token_ids: tuple[int, ...]
    fingerprint: str
    shape: tuple[int, int, int, int]  # [layers, tokens, kv_heads, head_dim]
    nbytes: int = 0  # K + V payload bytes
    origin: int = 0  # the position the keys were computed at (see FactKV)


def header_of(entry: FactKV) -> EntryHeader:
    """The header an entry will have on disk."""
    return EntryHeader(
        entry.key,
        tuple(entry.token_ids),
        entry.fingerprint,
        tuple(entry.k.shape),  # type: ignore[arg-type]
        entry.nbytes,
        entry.origin,
    )


def write_entry(path: Path, entry: FactKV) -> None:
    """Write ``entry`` to ``path`` atomically and durably (mode 0600)."""
    tensors = {"k": entry.k.contiguous(), "v": entry.v.contiguous()}
    metadata = {
        "format": FORMAT,
        "fingerprint": entry.fingerprint,
        "token_ids": json.dumps(list(entry.token_ids)),
        "origin": str(entry.origin),
    }
    write_atomic(path, lambda tmp: save_file(tensors, tmp, metadata=metadata), suffix=SUFFIX)


def read_header(key: str, path: Path) -> EntryHeader:
    """Parse the safetensors header (8-byte length, then JSON) without touching the tensors."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(8)
            size = struct.unpack("<Q", raw)[0] if len(raw) == 8 else -1
            if not 0 < size <= 1 << 26:
                raise ValueError(f"{path} has a {size}-byte header: not an entry")
            info = json.loads(fh.read(size))
    except FileNotFoundError:
        raise EntryMissingError(key) from None
    meta = info.pop("__metadata__", None) or {}
    if meta.get("format") != FORMAT or set(info) != {"k", "v"}:
        raise ValueError(f"{path} is not an {FORMAT} entry")
    nbytes = sum(end - start for start, end in (t["data_offsets"] for t in info.values()))
    return EntryHeader(
        key,
        tuple(json.loads(meta["token_ids"])),
        meta["fingerprint"],
        tuple(info["k"]["shape"]),  # type: ignore[arg-type]
        nbytes,
        int(meta.get("origin", 0)),
    )


def read_entry(header: EntryHeader, path: Path) -> FactKV:
    """The entry's tensors (``header`` from :func:`read_header` of the same file)."""
    try:
        with safe_open(str(path), framework="pt") as fh:
            k = fh.get_tensor("k")  # [layers, tokens, kv_heads, head_dim]
            v = fh.get_tensor("v")  # [layers, tokens, kv_heads, head_dim]
    except FileNotFoundError:
        raise EntryMissingError(header.key) from None
    return FactKV(header.key, list(header.token_ids), k, v, header.fingerprint, header.origin)


def scan(root: Path) -> tuple[int, int, int, int]:
    """``(entries, file bytes, K+V bytes, tokens)`` of the current format's entries in
    ``root``; files of an earlier format (stale: never injected) and ones deleted meanwhile are
    left out."""
    entries = file_bytes = payload = tokens = 0
    for path in root.glob(f"*{SUFFIX}"):
        if path.name.startswith("."):
            continue
        try:
            header = read_header(path.stem, path)
            file_bytes += path.stat().st_size
        except (EntryMissingError, FileNotFoundError, ValueError):
            continue
        entries += 1
        payload += header.nbytes
        tokens += len(header.token_ids)
    return entries, file_bytes, payload, tokens


def sweep_temp_files(root: Path) -> None:
    """Remove temporary files a crashed writer left behind (old enough to be nobody's)."""
    cutoff = time.time() - _STALE_TEMP_S
    for tmp in root.glob(f"{TEMP_PREFIX}*{SUFFIX}"):
        with contextlib.suppress(OSError):
            if tmp.stat().st_mtime < cutoff:
                tmp.unlink()
