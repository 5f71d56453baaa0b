"""A GGUF file's header, read fast: the scalar metadata and where each tensor lies.

``gguf.GGUFReader`` builds a numpy view of every metadata array element (SmolLM2's 49k-token
vocabulary and its merges: 4-6 s here, far more for a 128k-vocabulary Llama 3), which is too
slow for a check on every start. This reads the same layout (GGUF v2/v3, little-endian) with
``struct`` from a buffered file, seeking past array elements: SmolLM2's header in 0.06 s.
Nothing is dequantized.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# GGUF metadata value types: fixed sizes; 8 is a string, 9 an array.
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?"}
_SCALAR |= {10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class GGUFHeaderError(ValueError):
    """Not a GGUF header, or one that runs past the end of the file (cut short)."""


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # GGUF order (the fastest-varying dimension first)
    type_id: int  # GGMLQuantizationType value
    offset: int  # of its data in the file


@dataclass(frozen=True, slots=True)
class GGUFHeader:
    version: int
    metadata: dict[str, object]  # scalars and strings; arrays as their length
    tensors: list[TensorInfo]
    size: int  # the file's bytes


def read_header(path: Path) -> GGUFHeader:
    """The header of the GGUF ``path``; :class:`GGUFHeaderError` when it is not one or ends
    early."""
    with open(path, "rb") as fh:
        size = fh.seek(0, 2)
        fh.seek(0)
        cursor = _Cursor(fh, size)
        if cursor.take(4) != MAGIC:
            raise GGUFHeaderError("no GGUF magic")
        version = cursor.unpack("<I")
        if version not in (2, 3):
            raise GGUFHeaderError(f"GGUF version {version} (read: 2 and 3)")
        n_tensors, n_kv = cursor.unpack("<Q"), cursor.unpack("<Q")
        metadata: dict[str, object] = {}
        for _ in range(n_kv):
            key = cursor.string()
            metadata[key] = cursor.value(cursor.unpack("<I"))
        infos = []
        for _ in range(n_tensors):
            name = cursor.string()
            dims = cursor.unpack("<I")
            shape = tuple(cursor.unpack("<Q") for _ in range(dims))
            infos.append((name, shape, cursor.unpack("<I"), cursor.unpack("<Q")))
        data_start = fh.tell()
    alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))  # type: ignore[arg-type]
    start = -(-data_start // alignment) * alignment
    tensors = [TensorInfo(n, shape, t, start + offset) for n, shape, t, offset in infos]
    return GGUFHeader(version, metadata, tensors, size)


class _Cursor:
    __slots__ = ("fh", "size")

    def __init__(self, fh: BinaryIO, size: int) -> None:
        self.fh, self.size = fh, size

    def take(self, n: int) -> bytes:
        chunk = self.fh.read(n)
        if len(chunk) < n:
            raise GGUFHeaderError(f"the header runs past the end of the file ({self.size:,} bytes)")
        return chunk

    def skip(self, n: int) -> None:
        end = self.fh.tell() + n
        if end > self.size:
            raise GGUFHeaderError(f"the header runs past the end of the file ({self.size:,} bytes)")
        self.fh.seek(n, 1)

    def unpack(self, fmt: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.take(self.unpack("<Q")).decode("utf-8", errors="replace")

    def value(self, kind: int):
        if kind in _SCALAR:
            return self.unpack(_SCALAR[kind])
        if kind == _STRING:
            return self.string()
        if kind != _ARRAY:
            raise GGUFHeaderError(f"unknown metadata value type {kind}")
        item, count = self.unpack("<I"), self.unpack("<Q")
        if item in _SCALAR:  # skipped whole
            self.skip(count * struct.calcsize(_SCALAR[item]))
        elif item == _STRING:
            for _ in range(count):
                self.skip(self.unpack("<Q"))
        else:
            for _ in range(count):
                self.value(item)
        return count
