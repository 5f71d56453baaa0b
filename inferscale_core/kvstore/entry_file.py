"""One KV entry on disk: a safetensors file with ``k`` and ``v`` and a small JSON header.

This format is the contract between processes (docs/DESIGN.md, "The connector"): the encoder
writes it, and vLLM's connector reads it wherever it runs — the scheduler side reads only
headers (token ids, fingerprint, shape), the worker side the tensors. Writes are atomic
(:mod:`inferscale_core.files`).

Version 3 stores the entry's scheme (``model``, ``fp8`` or ``int4``, see
:mod:`~inferscale_core.kvstore.quant`) with the scales of a compressed one (``k_scale``,
``v_scale``, and for int4 ``k_zero``, ``v_zero`` and, for its 8-bit key channels, ``k_fine``,
``k_slot``), and a CRC-32 of every tensor's bytes. A
file that is cut short, whose header is not an entry's, whose shapes disagree with its token
ids and scheme, or whose bytes do not match their checksum, is refused with
:class:`EntryCorruptError` (an :class:`EntryMissingError`: the fact then goes in as text).
Version 2 files (the model's dtype, no checksum) are still read.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import struct
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch
from safetensors.torch import save

from inferscale_core.files import TEMP_PREFIX, write_atomic
from inferscale_core.kvstore import region
from inferscale_core.kvstore.quant import SCHEMES, entry_tensors, wide_channels
from inferscale_core.types import FactKV, KVQuant

# /3: a scheme (model | fp8 | int4), scales, a checksum; /2: post-RoPE keys with their origin
# in the model's dtype (still read); /1 stored pre-RoPE (stale: never injected)
FORMAT = "inferscale-kv/3"
FORMATS = ("inferscale-kv/2", FORMAT)
# Another version of ours (/1 stored pre-RoPE keys): stale, not damaged. Any other "format" (or
# none) in our folder is a header a damaged byte changed (safetensors orders the metadata as it
# likes, so a byte flipped mid-header may land in that value).
_OTHER_FORMAT = re.compile(r"inferscale-kv/\d+")
SUFFIX = ".safetensors"
_STALE_TEMP_S = 3600.0  # temporary files older than this are from a crashed writer
# a write the disk refused for want of room: no space, over a quota, over a file size limit
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


class EntryMissingError(KeyError):
    """No entry with that key in the store."""


class EntryCorruptError(EntryMissingError):
    """The entry's file is damaged (cut short, a bad header or shape, a checksum that does not
    match): it cannot be injected, so it counts as missing."""

    def __init__(self, key: str, why: str) -> None:
        super().__init__(key)
        self.why = why

    def __str__(self) -> str:
        return f"KV entry {self.args[0]} is damaged: {self.why}"


class StoreFullError(OSError):
    """The disk refused an entry's write for want of room (no space left, a quota, a file size
    limit). Nothing was replaced: the old entry, if any, is intact, and the fact, which stays
    in the fact log, goes in as text until space is freed and it is encoded."""

    def __init__(self, path: Path, nbytes: int, cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror, str(path))
        self.nbytes = nbytes

    def __str__(self) -> str:
        folder = Path(self.filename).parent
        return (
            f"The disk is full: a memory's KV ({self.nbytes / 1e6:.2f} MB) could not be written"
            f" to {folder} ({self.strerror}). Nothing is lost: the fact stays in the fact log"
            " and goes in as text until space is freed, then it is encoded again."
        )


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
    nbytes: int = 0  # payload bytes: K and V (codes, when compressed) and their scales
    origin: int = 0  # the position the keys were computed at (see FactKV)
    scheme: str = "model"  # how K and V are stored (inferscale_core.kvstore.quant)
    dtype: str = ""  # the dtype the entry was encoded in (and expands to), e.g. "float32"
    crc32: int | None = None  # of every tensor's bytes, by name; None: a /2 file (none kept)


def header_of(entry: FactKV) -> EntryHeader:
    """The header an entry will have on disk."""
    quant = entry.quant
    return EntryHeader(
        entry.key,
        tuple(entry.token_ids),
        entry.fingerprint,
        _logical_shape(entry),
        entry.nbytes,
        entry.origin,
        "model" if quant is None else quant.scheme,
        _dtype_name(entry.k.dtype if quant is None else quant.dtype),
        checksum(entry_tensors(entry)),
    )


def checksum(tensors: dict[str, torch.Tensor]) -> int:
    """CRC-32 of the tensors' bytes, in name order."""
    crc = 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous()
        crc = zlib.crc32(t.view(torch.uint8).reshape(-1).numpy(), crc)
    return crc


def write_entry(path: Path, entry: FactKV) -> EntryHeader:
    """Write ``entry`` to ``path`` atomically and durably (mode 0600); returns its header.
    Raises :class:`StoreFullError` if the disk has no room for it (the file at ``path`` is
    then as it was, and no temporary file is left)."""
    tensors = {name: t.contiguous() for name, t in entry_tensors(entry).items()}
    header = header_of(entry)
    metadata = {
        "format": FORMAT,
        "fingerprint": entry.fingerprint,
        "token_ids": json.dumps(list(entry.token_ids)),
        "origin": str(entry.origin),
        "scheme": header.scheme,
        "dtype": header.dtype,
        "shape": json.dumps(list(header.shape)),
        "crc32": str(header.crc32),
    }
    # serialized here and written by Python: safetensors' own file writer reports a full disk
    # as a SafetensorError without an errno
    data = save(tensors, metadata=metadata)
    try:
        write_atomic(path, data, suffix=SUFFIX)
    except OSError as exc:
        if exc.errno in _FULL_ERRNOS:
            raise StoreFullError(path, len(data), exc) from exc
        raise
    return header


def read_header(key: str, path: Path) -> EntryHeader:
    """Parse the safetensors header (8-byte length, then JSON) without touching the tensors.
    Raises :class:`EntryCorruptError` for a file that is not a whole entry (a header that
    does not parse, or says other than the file's size), ``ValueError`` for one of another
    format (stale: an earlier version's, never injected)."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(8)
            size = struct.unpack("<Q", raw)[0] if len(raw) == 8 else -1
            if not 0 < size <= 1 << 26:
                raise EntryCorruptError(key, f"a {size}-byte header")
            text = fh.read(size)
            file_size = os.fstat(fh.fileno()).st_size
        info = json.loads(text)
        meta = info.pop("__metadata__", None) or {}
        form = meta.get("format")
        if form not in FORMATS:
            if isinstance(form, str) and _OTHER_FORMAT.fullmatch(form):  # stale, never injected
                raise ValueError(f"{path} is not an {FORMAT} entry")
            raise EntryCorruptError(key, f"its format is {form!r}")  # a damaged header
        header = _parse_header(key, meta, info)
        end = max(t["data_offsets"][1] for t in info.values())
    except FileNotFoundError:
        raise EntryMissingError(key) from None
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise EntryCorruptError(key, f"its header does not parse ({exc})") from None
    if file_size != 8 + size + end:
        raise EntryCorruptError(key, f"{file_size} bytes, its header says {8 + size + end}")
    return header


def read_entry(header: EntryHeader, path: Path, pin: bool = False) -> FactKV:
    """The entry's tensors (``header`` from :func:`read_header` of the same file), read
    straight into one host region laid out as the GPU pool's (pinned if ``pin``: that needs
    CUDA, the caller guards; :mod:`~inferscale_core.kvstore.region`), and checked against the
    header's shapes and checksum (:class:`EntryCorruptError` if they differ, or if the file is
    cut short or its tensors' table does not parse).

    One open, one first read (the table, and a small entry whole), the rest in one ``preadv``
    straight into the region, and the checksum over the region: no copy of the file's bytes
    beyond the first read's (the old read made three: the file, safetensors' tensors, the
    pinned copy)."""
    key = header.key
    try:
        with open(path, "rb", buffering=0) as fh:  # raw reads, straight into the region
            tensors, crc = _read_tensors(key, fh, pin)
    except FileNotFoundError:
        raise EntryMissingError(key) from None
    if not _names_fit(set(tensors), header.scheme):
        raise EntryCorruptError(key, f"tensors {sorted(tensors)} for scheme {header.scheme!r}")
    if header.crc32 is not None and crc != header.crc32:
        raise EntryCorruptError(key, "its bytes do not match their checksum")
    entry = _entry_of(header, tensors)
    if _logical_shape(entry) != header.shape or entry.nbytes != header.nbytes:
        raise EntryCorruptError(key, "its tensors' shapes disagree with its header")
    return entry


@dataclass(slots=True)
class DiskUsage:
    """What the entries in a store's folder take (current formats; stale files left out)."""

    entries: int = 0
    file_bytes: int = 0
    payload: int = 0  # K/V (codes) and scales
    tokens: int = 0
    by_scheme: dict[str, list[int]] = field(default_factory=dict)  # scheme -> [entries, bytes]


def usage(root: Path) -> DiskUsage:
    """:class:`DiskUsage` of the entries in ``root`` (headers only); files of an earlier
    format, damaged ones and ones deleted meanwhile are left out."""
    out = DiskUsage()
    for path in root.glob(f"*{SUFFIX}"):
        if path.name.startswith("."):
            continue
        try:
            header = read_header(path.stem, path)
            size = path.stat().st_size
        except (EntryMissingError, FileNotFoundError, ValueError):  # damaged ones included
            continue
        out.entries += 1
        out.file_bytes += size
        out.payload += header.nbytes
        out.tokens += len(header.token_ids)
        counts = out.by_scheme.setdefault(header.scheme, [0, 0])
        counts[0] += 1
        counts[1] += size
    return out


def scan(root: Path) -> tuple[int, int, int, int]:
    """``(entries, file bytes, payload bytes, tokens)`` of :func:`usage`."""
    found = usage(root)
    return found.entries, found.file_bytes, found.payload, found.tokens


def sweep_temp_files(root: Path) -> None:
    """Remove temporary files a crashed writer left behind (old enough to be nobody's)."""
    cutoff = time.time() - _STALE_TEMP_S
    for tmp in root.glob(f"{TEMP_PREFIX}*{SUFFIX}"):
        with contextlib.suppress(OSError):
            if tmp.stat().st_mtime < cutoff:
                tmp.unlink()


# ---- helpers ----
_SAFETENSORS_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}
_TORCH_DTYPES = {
    "F32": torch.float32,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "U8": torch.uint8,
}
_FIRST_READ = 1 << 18  # bytes: the table of an entry (~1 KiB) and a small entry whole, at once
_THREAD = threading.local()  # each reader thread's buffer for first reads
_NAMES = {"k", "v"}
_QUANT_NAMES = {"fp8": _NAMES | {"k_scale", "v_scale"}}
_QUANT_NAMES["int4"] = _QUANT_NAMES["fp8"] | {"k_zero", "v_zero"}
# int4 with its widest key channels in 8 bits (since 2026-12-06; int4 files without them read)
_INT4_WIDE = _QUANT_NAMES["int4"] | {"k_fine", "k_slot"}


def _names_fit(names: set[str], scheme: str) -> bool:
    """Whether a file of ``scheme`` may hold tensors of these ``names``."""
    return names == _QUANT_NAMES.get(scheme, _NAMES) or (scheme == "int4" and names == _INT4_WIDE)


def _parse_header(key: str, meta: dict[str, str], info: dict[str, dict]) -> EntryHeader:
    """The header of a /2 or /3 file (``info``: its tensors' entries)."""
    scheme = meta.get("scheme", "model")
    if scheme not in SCHEMES:
        raise EntryCorruptError(key, f"an unknown scheme {scheme!r}")
    if not _names_fit(set(info), scheme):
        raise EntryCorruptError(key, f"tensors {sorted(info)} for scheme {scheme!r}")
    shape = json.loads(meta["shape"]) if "shape" in meta else info["k"]["shape"]
    if len(shape) != 4 or not all(isinstance(n, int) and n >= 0 for n in shape):
        raise EntryCorruptError(key, f"a shape of {shape!r}")
    token_ids = tuple(json.loads(meta["token_ids"]))
    if shape[1] != len(token_ids):
        raise EntryCorruptError(key, f"{len(token_ids)} token ids for {shape[1]} tokens")
    nbytes = sum(end - start for start, end in (t["data_offsets"] for t in info.values()))
    crc = meta.get("crc32")
    return EntryHeader(
        key,
        token_ids,
        meta["fingerprint"],
        tuple(shape),  # type: ignore[arg-type]
        nbytes,
        int(meta.get("origin", 0)),
        scheme,
        meta.get("dtype") or _SAFETENSORS_DTYPES.get(info["k"]["dtype"], info["k"]["dtype"]),
        None if crc is None else int(crc),
    )


def _read_tensors(key: str, fh: BinaryIO, pin: bool) -> tuple[dict[str, torch.Tensor], int]:
    """The file's tensors by name, as views of one fresh region (:func:`region.layout`) their
    bytes were read into, and the CRC-32 of their bytes in name order (:func:`checksum`);
    :class:`EntryCorruptError` for a table that does not parse or does not match the file's
    size, or a file cut short.

    The first read (up to :data:`_FIRST_READ` bytes, into a buffer each thread reuses) brings
    the table and, for a small entry, all of it: one request to the disk. The rest goes
    straight into the region, one ``preadv`` per run of tensors that follow one another in the
    file (one for a file safetensors wrote)."""
    file_size = os.fstat(fh.fileno()).st_size
    first = _first_buffer()
    got = _read_some(fh, first[: min(file_size, len(first))])
    head = first[:got]
    size = int.from_bytes(head[:8].tobytes(), "little") if got >= 8 else -1
    if not 0 < size <= 1 << 26:
        raise EntryCorruptError(key, f"a {size}-byte header")
    text = head[8 : 8 + size].tobytes()
    if len(text) < size:  # a header longer than the first read (not one of ours)
        text += fh.read(size - len(text))
    try:
        info = json.loads(text)
        info.pop("__metadata__", None)
        table = {
            name: (_TORCH_DTYPES[t["dtype"]], torch.Size(t["shape"]), *map(int, t["data_offsets"]))
            for name, t in info.items()
        }
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise EntryCorruptError(key, f"its tensors do not load ({exc})") from None
    sizes = []
    for name, (dtype, shape, start, end) in table.items():
        nbytes = shape.numel() * dtype.itemsize
        if name not in region.ORDER or min(shape, default=0) < 0 or not 0 <= start <= end:
            raise EntryCorruptError(key, f"its tensor {name!r} does not load")
        if end - start != nbytes:
            raise EntryCorruptError(key, f"its tensor {name!r} does not load")
        sizes.append((name, nbytes))
    data_at = 8 + size
    end = max((t[3] for t in table.values()), default=0)
    if file_size != data_at + end:
        raise EntryCorruptError(key, f"{file_size} bytes, its header says {data_at + end}")
    offsets, total = region.layout(sizes)
    buffer = torch.empty(total, dtype=torch.uint8, pin_memory=pin)  # [total]
    flat = buffer.numpy()
    runs: list[tuple[int, list[np.ndarray]]] = []  # (file offset, region slices) still to read
    for name, (_, _, start, stop) in sorted(table.items(), key=lambda item: item[1][2]):
        at, target = data_at + start, flat[offsets[name] : offsets[name] + stop - start]
        have = min(max(got - at, 0), len(target))  # bytes the first read brought already
        target[:have] = head[at : at + have]
        if have < len(target):
            if runs and runs[-1][0] + sum(map(len, runs[-1][1])) == at + have:
                runs[-1][1].append(target[have:])
            else:
                runs.append((at + have, [target[have:]]))
    for at, targets in runs:
        _read_at(key, fh, targets, at)
    crc = 0
    for name in sorted(table):
        crc = zlib.crc32(flat[offsets[name] : offsets[name] + table[name][3] - table[name][2]], crc)
    tensors = {
        name: buffer[offsets[name] : offsets[name] + stop - start].view(dtype).view(shape)
        for name, (dtype, shape, start, stop) in table.items()
    }
    return tensors, crc


def _first_buffer() -> np.ndarray:
    """This thread's buffer for first reads (reused: fresh memory page-faults every time)."""
    buf = getattr(_THREAD, "first", None)
    if buf is None:
        buf = _THREAD.first = np.empty(_FIRST_READ, dtype=np.uint8)
    return buf


def _read_some(fh: BinaryIO, out: np.ndarray) -> int:
    """Fill ``out`` from where ``fh`` is; fewer bytes only at the file's end."""
    view, got = memoryview(out), 0
    while got < len(view) and (n := fh.readinto(view[got:])):
        got += n
    return got


def _read_at(key: str, fh: BinaryIO, targets: list[np.ndarray], offset: int) -> None:
    """Fill ``targets`` (uint8) in turn from the file's bytes at ``offset``: one ``preadv``
    where the OS has it (reads from the page cache are copied once, straight into them)."""
    views = [memoryview(t) for t in targets if len(t)]
    preadv = getattr(os, "preadv", None)
    while views:
        if preadv is not None:
            n = preadv(fh.fileno(), views, offset)
        else:
            fh.seek(offset)
            n = fh.readinto(views[0])
        if not n:
            raise EntryCorruptError(key, f"cut short at byte {offset}")
        offset += n
        while views and n >= len(views[0]):
            n -= len(views[0])
            views.pop(0)
        if n:
            views[0] = views[0][n:]


def _entry_of(header: EntryHeader, tensors: dict[str, torch.Tensor]) -> FactKV:
    quant = None
    if header.scheme != "model":
        dims = header.shape[3]
        quant = KVQuant(
            header.scheme,
            getattr(torch, header.dtype),
            dims,
            tensors["v"].shape[-1] * (2 if header.scheme == "int4" else 1),
            tensors["k_scale"],
            tensors["v_scale"],
            tensors.get("k_zero"),
            tensors.get("v_zero"),
            tensors.get("k_fine"),
            tensors.get("k_slot"),
        )
    fine, slot = tensors.get("k_fine"), tensors.get("k_slot")
    if fine is not None and slot is not None:  # the kernels index by these shapes
        layers, tokens, heads, dims = header.shape
        wide = wide_channels(dims)
        if tuple(fine.shape) != (layers, tokens, heads, wide // 2) or tuple(slot.shape) != (
            layers,
            1,
            heads,
            dims,
        ):
            raise EntryCorruptError(header.key, "its 8-bit key channels' shapes are not its own")
    try:
        return FactKV(
            header.key,
            list(header.token_ids),
            tensors["k"],
            tensors["v"],
            header.fingerprint,
            header.origin,
            quant,
        )
    except ValueError as exc:
        raise EntryCorruptError(header.key, str(exc)) from None


def _logical_shape(entry: FactKV) -> tuple[int, int, int, int]:
    """``[layers, tokens, kv_heads, head_dim]`` of the keys, whatever their codes' shape."""
    layers, tokens, heads, dim = entry.k.shape
    return (layers, tokens, heads, dim if entry.quant is None else entry.quant.k_dim)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
