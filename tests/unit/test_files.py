"""The one atomic-write helper: a reader sees the old file or the new one, never half."""

from __future__ import annotations

import pytest

from inferscale_core.files import TEMP_PREFIX, write_atomic


def test_text_bytes_and_a_writer_function_each_replace_the_file_privately(tmp_path):
    path = tmp_path / "settings.toml"
    assert write_atomic(path, "k = 1\n") == path
    assert path.read_text() == "k = 1\n" and path.stat().st_mode & 0o777 == 0o600
    write_atomic(path, b"k = 2\n", mode=0o644)
    assert path.read_bytes() == b"k = 2\n" and path.stat().st_mode & 0o777 == 0o644

    def writer(tmp: str) -> None:
        with open(tmp, "w") as fh:
            fh.write("k = 3\n")

    write_atomic(path, writer)
    assert path.read_text() == "k = 3\n"
    assert [p.name for p in tmp_path.iterdir()] == ["settings.toml"]  # no temporary left


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "entry.bin"
    write_atomic(path, b"old")

    def broken(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            fh.write(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomic(path, broken)
    assert path.read_bytes() == b"old"
    assert not list(tmp_path.glob(f"{TEMP_PREFIX}*"))
