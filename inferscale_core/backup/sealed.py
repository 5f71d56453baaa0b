"""The backup file's envelope: a header, then the payload in authenticated chunks.

Layout (all integers big-endian)::

    b"INFERSCALE-BACKUP\\n"        magic, 18 bytes
    u32 n, n bytes of JSON          the header: {"format": 1, "chunk_size": 1048576,
                                    "encryption": null | {"cipher": "aes-256-gcm", "kdf":
                                    "scrypt", "n", "r", "p", "salt", "nonce_prefix", "key_check"}}
    then per chunk: u32 m, m bytes  the chunk's data (<= chunk_size bytes) and a 16-byte tag

Every chunk is authenticated with the header's SHA-256, its index and whether it is the last
one (``AAD = sha256(magic + header) || u64 index || u8 last``), so a flipped byte, a chunk moved
or dropped, a file cut short (its last chunk is not marked last) or bytes after the end are all
refused, and the header cannot be changed either. Encrypted: AES-256-GCM under a key derived
from the passphrase by scrypt (n = 2**17, r = 8, p = 1: 128 MiB, ~0.3 s), nonce = the header's
random 8-byte prefix || u32 chunk index (one key per file: a fresh salt each time). Plain: the
tag is the first 16 bytes of SHA-256 over the AAD and the data (damage, not an attacker).
``key_check`` (SHA-256 of a second derived key) tells a wrong passphrase from a damaged file.
Imports nothing from the project.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import struct
from dataclasses import dataclass
from typing import BinaryIO

MAGIC = b"INFERSCALE-BACKUP\n"
FORMAT_VERSION = 1  # of the whole file: envelope and payload (see archive.py)
CHUNK_SIZE = 1 << 20  # payload bytes per chunk: 1 MiB
TAG_SIZE = 16  # bytes: the GCM tag (or the plain digest)
SCRYPT_N, SCRYPT_R, SCRYPT_P = 1 << 17, 8, 1  # 128 * r * n = 128 MiB, ~0.3 s on one core
_MAX_N = 1 << 20  # refused above this: a damaged header must not ask for GiBs
_MAX_HEADER = 64 * 1024  # bytes
_MAX_CHUNK = 64 << 20  # bytes: a header may not ask for bigger chunks
_U32 = struct.Struct(">I")


class BackupError(ValueError):
    """A backup that cannot be read or restored; the message is one line saying why."""


class NotABackupError(BackupError):
    pass


class NewerFormatError(BackupError):
    pass


class DamagedBackupError(BackupError):
    """Truncated, changed or otherwise damaged (authentication failed)."""


class PassphraseNeededError(BackupError):
    pass


class WrongPassphraseError(BackupError):
    pass


@dataclass(frozen=True, slots=True)
class Header:
    format: int
    chunk_size: int
    encryption: dict | None  # None: plain
    raw: bytes  # the JSON as stored (authenticated through every chunk's AAD)

    @property
    def encrypted(self) -> bool:
        return self.encryption is not None


class _Sealer:
    """Seals and opens the chunks of one file (plain digest or AES-256-GCM)."""

    def __init__(self, header_digest: bytes, key: bytes | None, nonce_prefix: bytes) -> None:
        self.digest = header_digest
        self.prefix = nonce_prefix
        if key is None:
            self.aead = None
        else:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM

            self.aead = AESGCM(key)

    def _aad(self, index: int, last: bool) -> bytes:
        return self.digest + struct.pack(">QB", index, int(last))

    def seal(self, index: int, last: bool, data: bytes) -> bytes:
        aad = self._aad(index, last)
        if self.aead is None:
            return data + hashlib.sha256(aad + data).digest()[:TAG_SIZE]
        return self.aead.encrypt(self.prefix + _U32.pack(index), data, aad)

    def open(self, index: int, last: bool, body: bytes) -> bytes | None:
        """The chunk's data, or None when it does not authenticate."""
        aad = self._aad(index, last)
        if self.aead is None:
            data, tag = body[:-TAG_SIZE], body[-TAG_SIZE:]
            want = hashlib.sha256(aad + data).digest()[:TAG_SIZE]
            return data if hmac.compare_digest(tag, want) else None
        from cryptography.exceptions import InvalidTag

        try:
            return self.aead.decrypt(self.prefix + _U32.pack(index), body, aad)
        except InvalidTag:
            return None


def _derive(passphrase: str, enc: dict) -> tuple[bytes, str]:
    """``(AES key, key_check)`` of a passphrase under the header's scrypt parameters."""
    from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

    salt = bytes.fromhex(enc["salt"])
    kdf = Scrypt(salt=salt, length=64, n=enc["n"], r=enc["r"], p=enc["p"])
    keys = kdf.derive(passphrase.encode("utf-8"))
    return keys[:32], hashlib.sha256(keys[32:]).hexdigest()


class SealedWriter:
    """A write-only stream that seals what it is given into ``out`` chunk by chunk.

    ``passphrase`` None writes a plain (authenticated, not encrypted) file. :meth:`close`
    writes the last chunk (possibly empty); a file without it is refused as truncated.
    """

    def __init__(self, out: BinaryIO, passphrase: str | None = None) -> None:
        encryption = None
        key = None
        prefix = b""
        if passphrase is not None:
            if not passphrase:
                raise ValueError("the passphrase is empty")
            prefix = os.urandom(8)
            encryption = {
                "cipher": "aes-256-gcm",
                "kdf": "scrypt",
                "n": SCRYPT_N,
                "r": SCRYPT_R,
                "p": SCRYPT_P,
                "salt": os.urandom(16).hex(),
                "nonce_prefix": prefix.hex(),
            }
            key, encryption["key_check"] = _derive(passphrase, encryption)
        header = {"format": FORMAT_VERSION, "chunk_size": CHUNK_SIZE, "encryption": encryption}
        raw = json.dumps(header, sort_keys=True).encode()
        self._out = out
        self._sealer = _Sealer(hashlib.sha256(MAGIC + raw).digest(), key, prefix)
        self._buffer = bytearray()
        self._index = 0
        self._closed = False
        out.write(MAGIC + _U32.pack(len(raw)) + raw)

    def write(self, data: bytes) -> int:
        self._buffer += data
        while len(self._buffer) > CHUNK_SIZE:  # ">": the last chunk is kept for close()
            self._emit(bytes(self._buffer[:CHUNK_SIZE]), last=False)
            del self._buffer[:CHUNK_SIZE]
        return len(data)

    def close(self) -> None:
        """Write the last chunk (the stream is complete only then); ``out`` stays open."""
        if not self._closed:
            self._emit(bytes(self._buffer), last=True)
            self._buffer.clear()
            self._closed = True

    def _emit(self, data: bytes, last: bool) -> None:
        body = self._sealer.seal(self._index, last, data)
        self._out.write(_U32.pack(len(body)) + body)
        self._index += 1


def read_header(src: BinaryIO, name: str) -> Header:
    """The header at the start of ``src`` (left just after it); :class:`BackupError` if ``src``
    is not a backup, is of a newer format, or its header is damaged. ``name`` is for messages."""
    magic = src.read(len(MAGIC))
    if magic != MAGIC:
        raise NotABackupError(f"{name} is not an inferscale-assistant backup")
    size = src.read(4)
    if len(size) < 4 or _U32.unpack(size)[0] > _MAX_HEADER:
        raise DamagedBackupError(f"{name} is damaged or truncated (its header)")
    raw = src.read(_U32.unpack(size)[0])
    try:
        fields = json.loads(raw)
        version = int(fields["format"])
    except (ValueError, KeyError, TypeError) as exc:
        raise DamagedBackupError(f"{name} is damaged or truncated (its header)") from exc
    if version > FORMAT_VERSION:
        raise NewerFormatError(
            f"{name} is backup format {version}; this inferscale-assistant reads format"
            f" {FORMAT_VERSION} and older: restore it with a newer version"
        )
    try:
        header = Header(version, int(fields["chunk_size"]), fields["encryption"], raw)
        if not 0 < header.chunk_size <= _MAX_CHUNK:
            raise ValueError(header.chunk_size)
        if header.encrypted:
            enc = header.encryption
            assert enc is not None
            if enc["cipher"] != "aes-256-gcm" or enc["kdf"] != "scrypt" or enc["n"] > _MAX_N:
                raise ValueError(enc)
            bytes.fromhex(enc["salt"]), bytes.fromhex(enc["nonce_prefix"])
    except (ValueError, KeyError, TypeError) as exc:
        raise DamagedBackupError(f"{name} is damaged (its header)") from exc
    return header


class SealedReader:
    """A read-only stream of the payload of a file whose :func:`read_header` was read.

    Each chunk is authenticated before any of its bytes is returned; the end of the payload is
    returned only once the last chunk (marked so) has been read with nothing after it. Raises
    :class:`DamagedBackupError` otherwise. Wrong or missing passphrases are refused on
    construction (:class:`WrongPassphraseError`, :class:`PassphraseNeededError`).
    """

    def __init__(self, src: BinaryIO, header: Header, passphrase: str | None, name: str) -> None:
        self.name = name
        key = None
        prefix = b""
        if header.encrypted:
            enc = header.encryption
            assert enc is not None
            if passphrase is None:
                raise PassphraseNeededError(
                    f"{name} is encrypted: give its passphrase (prompted on a terminal,"
                    " --passphrase-file PATH, or INFERSCALE_BACKUP_PASSPHRASE)"
                )
            key, check = _derive(passphrase, enc)
            if not hmac.compare_digest(check, str(enc.get("key_check", ""))):
                raise WrongPassphraseError(f"wrong passphrase for {name}")
            prefix = bytes.fromhex(enc["nonce_prefix"])
        self._src = src
        self._max_body = header.chunk_size + TAG_SIZE
        self._sealer = _Sealer(hashlib.sha256(MAGIC + header.raw).digest(), key, prefix)
        self._index = 0
        self._data = b""
        self._pos = 0
        self._done = False
        self._next = self._read_frame()  # one frame ahead: is the current one the last?

    def _damaged(self, what: str) -> DamagedBackupError:
        return DamagedBackupError(
            f"{self.name} is damaged or was changed ({what}); nothing was restored from it"
        )

    def _read_frame(self) -> bytes | None:
        size = self._src.read(4)
        if not size:
            return None
        if len(size) < 4:
            raise self._damaged(f"truncated in chunk {self._index}")
        (length,) = _U32.unpack(size)
        if not TAG_SIZE <= length <= self._max_body:
            raise self._damaged(f"chunk {self._index} has a bad length")
        body = self._src.read(length)
        if len(body) < length:
            raise self._damaged(f"truncated in chunk {self._index}")
        return body

    def _advance(self) -> bool:
        """Load the next chunk's data; False at the (authenticated) end."""
        if self._done:
            return False
        body = self._next
        if body is None:  # no frame where one was due
            raise self._damaged(f"truncated after chunk {self._index - 1}")
        self._next = self._read_frame()
        last = self._next is None
        data = self._sealer.open(self._index, last, body)
        if data is None:
            where = "truncated, or " if last else ""
            raise self._damaged(f"{where}chunk {self._index} fails authentication")
        self._index += 1
        self._data, self._pos = data, 0
        self._done = last
        return True

    def read(self, n: int = -1) -> bytes:
        parts: list[bytes] = []
        want = n if n >= 0 else None
        while want is None or want > 0:
            if self._pos >= len(self._data) and not self._advance():
                break
            take = (
                len(self._data) - self._pos
                if want is None
                else min(want, len(self._data) - self._pos)
            )
            parts.append(self._data[self._pos : self._pos + take])
            self._pos += take
            if want is not None:
                want -= take
        return b"".join(parts)

    def at_end(self) -> bool:
        """True once the whole payload, its last chunk included, has been read."""
        return self._done and self._pos >= len(self._data)
