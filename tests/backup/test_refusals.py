"""What restore refuses, with one line and exit 2, writing nothing: a file that is not a
backup, a cut one, a newer format, a changed byte anywhere, a wrong or missing passphrase, a
home that holds files (without --force)."""

from __future__ import annotations

import hashlib
import io
import json
import sqlite3
import struct
import tarfile
from pathlib import Path

import pytest

from inferscale_core.backup import (
    BackupError,
    DamagedBackupError,
    Member,
    NewerFormatError,
    NotABackupError,
    WrongPassphraseError,
    restore_backup,
    write_backup,
)
from inferscale_core.backup.manifest import Manifest, Stored
from inferscale_core.backup.sealed import MAGIC, SealedWriter
from tests.backup.helpers import PASSPHRASE, build_home, cli, digest_tree, one_line


@pytest.fixture(scope="module")
def backups(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A plain and an encrypted backup of a small home (several 1 MiB chunks each)."""
    folder = tmp_path_factory.mktemp("backups")
    home = folder / "home"
    build_home(home, conversations=50, facts=1000)
    made = {}
    for name, args, secret in (("plain", [], None), ("encrypted", ["--encrypt"], PASSPHRASE)):
        path = folder / f"{name}.isbak"
        done = cli(home, "backup", *args, str(path), passphrase=secret)
        assert done.returncode == 0, done.stderr
        made[name] = path
    assert made["plain"].stat().st_size > 1 << 20  # two chunks at least
    return made


def _roots(home: Path) -> dict[str, Path]:
    return {"data": home / "data", "config": home / "config"}


def _untouched(home: Path) -> None:
    """Nothing was written beside or into ``home`` (it does not exist, or is as made)."""
    assert not home.exists() or not [p for p in home.rglob("*") if p.is_file()], list(
        home.rglob("*")
    )
    if home.exists():
        assert not [p for p in home.iterdir() if p.name.startswith(".")]


def _flipped(src: Path, dst: Path, position: int) -> Path:
    data = bytearray(src.read_bytes())
    data[position] ^= 0x01
    dst.write_bytes(bytes(data))
    return dst


def test_not_a_backup_is_one_line(tmp_path: Path):
    other = tmp_path / "notes.txt"
    other.write_text("my shopping list\n" * 100)
    home = tmp_path / "home"
    done = cli(home, "restore", str(other))
    assert done.returncode == 2
    assert "is not an inferscale-assistant backup" in one_line(done.stderr)
    _untouched(home)


def test_newer_format_is_one_line(tmp_path: Path, backups: dict[str, Path]):
    raw = backups["plain"].read_bytes()
    (size,) = struct.unpack(">I", raw[len(MAGIC) : len(MAGIC) + 4])
    header = json.loads(raw[len(MAGIC) + 4 : len(MAGIC) + 4 + size])
    header["format"] = 2
    new = json.dumps(header).encode()
    newer = tmp_path / "newer.isbak"
    newer.write_bytes(MAGIC + struct.pack(">I", len(new)) + new + raw[len(MAGIC) + 4 + size :])
    home = tmp_path / "home"
    done = cli(home, "restore", str(newer))
    assert done.returncode == 2
    assert "format 2" in one_line(done.stderr) and "newer version" in done.stderr
    _untouched(home)
    with pytest.raises(NewerFormatError):
        restore_backup(newer, _roots(home))


def test_truncated_file_is_refused(tmp_path: Path, backups: dict[str, Path]):
    raw = backups["plain"].read_bytes()
    home = tmp_path / "home"
    cut = tmp_path / "cut.isbak"
    cut.write_bytes(raw[: len(raw) // 2])
    done = cli(home, "restore", str(cut))
    assert done.returncode == 2
    assert "damaged" in one_line(done.stderr)
    _untouched(home)
    # Cut anywhere, a whole last chunk dropped included, in the header too: refused.
    ends = [len(MAGIC) + 2, len(MAGIC) + 30, 1 << 20, len(raw) - 1, _last_frame_start(raw)]
    for end in ends:
        cut.write_bytes(raw[:end])
        with pytest.raises((DamagedBackupError, NotABackupError)):
            restore_backup(cut, _roots(home))
        _untouched(home)


def _last_frame_start(raw: bytes) -> int:
    """Where the last chunk's frame starts (walking the frames from the header on)."""
    (size,) = struct.unpack(">I", raw[len(MAGIC) : len(MAGIC) + 4])
    at = len(MAGIC) + 4 + size
    start = at
    while at < len(raw):
        start = at
        (length,) = struct.unpack(">I", raw[at : at + 4])
        at += 4 + length
    assert at == len(raw) and start > len(MAGIC)
    return start


def test_wrong_or_missing_passphrase_is_refused(tmp_path: Path, backups: dict[str, Path]):
    home = tmp_path / "home"
    done = cli(home, "restore", str(backups["encrypted"]), passphrase="not the passphrase")
    assert done.returncode == 2
    assert "wrong passphrase" in one_line(done.stderr)
    _untouched(home)
    done = cli(home, "restore", str(backups["encrypted"]))  # no terminal, file or variable
    assert done.returncode == 2
    assert "needs a passphrase" in one_line(done.stderr)
    _untouched(home)


def test_a_flipped_byte_anywhere_is_refused(tmp_path: Path, backups: dict[str, Path]):
    home = tmp_path / "home"
    encrypted = backups["encrypted"]
    size = encrypted.stat().st_size
    bad = _flipped(encrypted, tmp_path / "bad.isbak", size // 2)
    done = cli(home, "restore", str(bad), passphrase=PASSPHRASE)
    assert done.returncode == 2
    assert "damaged or was changed" in one_line(done.stderr)
    _untouched(home)
    raw = encrypted.read_bytes()
    header_end = len(MAGIC) + 4 + struct.unpack(">I", raw[len(MAGIC) : len(MAGIC) + 4])[0]
    positions = [5, len(MAGIC) + 20, header_end + 2, header_end + 100, (1 << 20) + 40, size - 1]
    for position in positions:
        bad = _flipped(encrypted, tmp_path / "bad.isbak", position)
        with pytest.raises((DamagedBackupError, NotABackupError, WrongPassphraseError)):
            restore_backup(bad, _roots(home), passphrase=lambda: PASSPHRASE)
        _untouched(home)
    plain = backups["plain"]  # not encrypted, still authenticated
    for position in (plain.stat().st_size // 3, plain.stat().st_size - 5):
        bad = _flipped(plain, tmp_path / "bad.isbak", position)
        with pytest.raises(DamagedBackupError):
            restore_backup(bad, _roots(home))
        _untouched(home)


def test_a_home_with_files_is_refused_without_force(tmp_path: Path, backups: dict[str, Path]):
    home = tmp_path / "home"
    build_home(home, conversations=2, facts=10)
    before = digest_tree(home)
    done = cli(home, "restore", str(backups["plain"]))
    assert done.returncode == 2
    assert "--force" in one_line(done.stderr)
    assert digest_tree(home) == before


def _damaged_db(path: Path) -> Path:
    """A database SQLite still reads, whose index lost its rows (``integrity_check`` fails)."""
    con = sqlite3.connect(path)
    with con:
        con.execute("CREATE TABLE t (a INTEGER, b TEXT)")
        con.execute("CREATE INDEX tb ON t (b)")
        con.executemany("INSERT INTO t VALUES (?, ?)", [(i, f"row {i}") for i in range(500)])
    with con:
        con.execute("PRAGMA writable_schema = ON")
        con.execute("UPDATE sqlite_master SET sql = 'CREATE INDEX tb ON t (a)' WHERE name = 'tb'")
    con.close()
    return path


def _hand_made(path: Path, name: str, data: bytes, rows: dict[str, int]) -> Path:
    """A well-formed backup of one database member, as ``write_backup`` would not make it."""
    manifest = Manifest(1, "2026-01-01T00:00:00+00:00", "test", False)
    manifest.members.append(
        Stored(name, "sqlite", len(data), hashlib.sha256(data).hexdigest(), rows)
    )
    with open(path, "wb") as out:
        sealed = SealedWriter(out)
        with tarfile.open(fileobj=sealed, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for member, body in ((name, data), ("manifest.json", manifest.to_json())):
                info = tarfile.TarInfo(member)
                info.size = len(body)
                tar.addfile(info, io.BytesIO(body))
        sealed.close()
    return path


def test_a_damaged_database_is_refused_at_backup_and_at_restore(tmp_path: Path):
    db = _damaged_db(tmp_path / "x.db")
    target = tmp_path / "x.isbak"
    with pytest.raises(BackupError, match="integrity_check"):
        write_backup(target, [Member("data/x.db", db, "sqlite")])
    assert not target.exists() and not [p for p in tmp_path.iterdir() if p.name[0] == "."]
    home = tmp_path / "home"
    raw = db.read_bytes()
    bad = _hand_made(tmp_path / "bad.isbak", "data/x.db", raw, {"t": 500})
    with pytest.raises(DamagedBackupError, match="fails integrity_check"):
        restore_backup(bad, _roots(home))
    _untouched(home)
    good = sqlite3.connect(tmp_path / "ok.db")
    with good:
        good.execute("CREATE TABLE t (a)")
        good.execute("INSERT INTO t VALUES (1)")
    good.close()
    ok = (tmp_path / "ok.db").read_bytes()
    miscounted = _hand_made(tmp_path / "count.isbak", "data/x.db", ok, {"t": 2})
    with pytest.raises(DamagedBackupError, match="other row counts"):
        restore_backup(miscounted, _roots(home))
    _untouched(home)
    restore_backup(_hand_made(tmp_path / "fine.isbak", "data/x.db", ok, {"t": 1}), _roots(home))
    assert (home / "data" / "x.db").read_bytes() == ok
