"""An entry written in head shards: under tensor parallelism each rank's cache holds only its
own KV heads, so a capture reaches the store as one part per rank.

Each rank writes its heads as a part file beside the entries (``.heads-<key>.<start>-<stop>-of-
<total>.safetensors``: dot-prefixed, so listings and stats skip it), atomically, then lists the
parts of the key. Whoever finds them covering every head joins them into the whole entry and
puts it; as each rank renames its part before listing, the last one to finish always sees every
part (two that both do put the same bytes). Entries on disk therefore always hold all heads,
and a store written at one TP size serves any other (:mod:`inferscale_core.tp_heads`).
"""

from __future__ import annotations

import contextlib
import glob
import time
from pathlib import Path

import torch

from inferscale_core.kvstore.entry_file import SUFFIX, read_entry, read_header, write_entry
from inferscale_core.types import FactKV

PREFIX = ".heads-"
_STALE_S = 3600.0  # parts older than this are from a rank that never finished its capture


def part_path(root: Path, key: str, start: int, stop: int, total: int) -> Path:
    return root / f"{PREFIX}{key}.{start}-{stop}-of-{total}{SUFFIX}"


def write_part(root: Path, part: FactKV, start: int, total: int) -> None:
    """Write heads ``[start, start + part's heads)`` of ``part.key`` durably."""
    stop = start + part.k.shape[2]
    if not 0 <= start < stop <= total:
        raise ValueError(f"heads {start}..{stop} are not a part of {total} heads")
    write_entry(part_path(root, part.key, start, stop, total), part)


def complete_parts(root: Path, key: str, total: int) -> list[Path] | None:
    """The parts of ``key`` that tile its ``total`` heads, in head order; None while some
    head is missing."""
    by_start: dict[int, tuple[int, Path]] = {}
    tail = f"-of-{total}{SUFFIX}"
    for name in glob.glob(glob.escape(f"{root}/{PREFIX}{key}.") + f"*{tail}"):
        path = Path(name)
        key_part, _, heads = path.name[len(PREFIX) : -len(tail)].rpartition(".")
        start, _, stop = heads.partition("-")
        if key_part == key and start.isdigit() and stop.isdigit():
            by_start[int(start)] = (int(stop), path)
    parts, at = [], 0
    while at < total:
        if at not in by_start:
            return None
        at, path = by_start[at]
        parts.append(path)
    return parts


def join_parts(key: str, parts: list[Path]) -> FactKV:
    """The whole entry from its parts (raises FileNotFoundError or
    :class:`~inferscale_core.kvstore.EntryMissingError` if another rank removed them first)."""
    entries = [read_entry(read_header(key, path), path) for path in parts]
    first = entries[0]
    for entry in entries[1:]:
        if (entry.token_ids, entry.fingerprint, entry.origin) != (
            first.token_ids,
            first.fingerprint,
            first.origin,
        ):
            raise ValueError(f"the head parts of entry {key} are of different captures")
    return FactKV(
        key,
        first.token_ids,
        torch.cat([e.k for e in entries], dim=2),  # [layers, tokens, total heads, head_dim]
        torch.cat([e.v for e in entries], dim=2),
        first.fingerprint,
        first.origin,
    )


def remove_parts(parts: list[Path]) -> None:
    for path in parts:
        path.unlink(missing_ok=True)


def sweep_parts(root: Path) -> None:
    """Remove parts a rank left behind without the others (old enough to be nobody's)."""
    cutoff = time.time() - _STALE_S
    for path in root.glob(f"{PREFIX}*{SUFFIX}"):
        with contextlib.suppress(OSError):
            if path.stat().st_mtime < cutoff:
                path.unlink()
