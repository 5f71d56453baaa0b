"""``kill -9`` in the middle: a backup leaves no file under its name, a restore leaves the old
home as it was; the next run clears what the killed one left and succeeds."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.backup.helpers import build_home, cli, cli_env, digest_tree
from tests.support import REPO

BALLAST_MIB = 160  # makes the fact log big enough (seconds of work) to be killed mid-way


@pytest.fixture(scope="module")
def big_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A home whose fact log also holds BALLAST_MIB MiB of random blobs."""
    home = tmp_path_factory.mktemp("big") / "home"
    build_home(home, conversations=10, facts=100)
    con = sqlite3.connect(home / "data" / "memory.db")
    with con:
        con.execute("CREATE TABLE ballast (b BLOB)")
        con.execute(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)"
            " INSERT INTO ballast SELECT randomblob(1048576) FROM n",
            (BALLAST_MIB,),
        )
    con.close()
    return home


def _kill_when(
    home: Path, args: list[str], ready: Callable[[], bool], timeout: float = 60.0
) -> subprocess.Popen:
    """Start ``inferscale-assistant ARGS``; ``kill -9`` it as soon as ``ready()``; it must
    still have been running then."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", *args],
        cwd=REPO,
        env=cli_env(home),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, f"finished before it could be killed: {proc.stderr.read()}"
        assert time.monotonic() < deadline, "never got there"
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(10) == -signal.SIGKILL, "it had finished before the kill"
    proc.stderr.close()
    return proc


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _part_bytes(folder: Path, prefix: str) -> int:
    """Bytes in the work files of a running backup or restore (``prefix*`` in ``folder``)."""
    total = 0
    for work in folder.glob(f"{prefix}*"):
        for p in work.rglob("*"):
            with contextlib.suppress(FileNotFoundError):  # renamed or removed meanwhile
                total += p.stat().st_size if p.is_file() else 0
    return total


def test_kill_9_during_backup_leaves_no_file_under_its_name(tmp_path: Path, big_home: Path):
    target = tmp_path / "memory.isbak"
    # Killed once the file itself is being written (the fact log already copied).
    _kill_when(
        big_home,
        ["backup", str(target)],
        lambda: _part_bytes(tmp_path, ".memory.isbak.part-") > (BALLAST_MIB + 20) << 20,
    )
    assert not target.exists()
    assert list(tmp_path.glob(".memory.isbak.part-*")), "the killed run's work folder"
    # Over an older backup: that one stays as it was.
    target.write_bytes(b"an older backup")
    _kill_when(
        big_home,
        ["backup", str(target)],
        lambda: _part_bytes(tmp_path, ".memory.isbak.part-") > 40 << 20,
    )
    assert target.read_bytes() == b"an older backup"


def test_kill_9_during_restore_leaves_the_old_home_untouched(tmp_path: Path, big_home: Path):
    backup = tmp_path / "big.isbak"
    left = tmp_path / f".big.isbak.part-{_dead_pid()}-abc"  # what a killed backup leaves
    left.mkdir()
    (left / "backup").write_bytes(b"half")
    done = cli(big_home, "backup", str(backup))
    assert done.returncode == 0, done.stderr
    assert not left.exists(), "a dead backup's work folder is cleared by the next one"
    home = tmp_path / "home"
    build_home(home, conversations=4, facts=40)
    before = digest_tree(home)

    _kill_when(
        home,
        ["restore", "--force", str(backup)],
        lambda: _part_bytes(home, ".data.restore-") > 60 << 20,
    )
    leftovers = [p.name for p in home.iterdir() if p.name.startswith(".")]
    assert leftovers, "the killed restore's work folder"
    assert {k: v for k, v in digest_tree(home).items() if not k.startswith(".")} == before

    done = cli(home, "restore", "--force", str(backup))  # clears the leftovers, keeps the old
    assert done.returncode == 0, done.stderr
    assert not [p for p in home.iterdir() if p.name.startswith(".")]
    kept = sorted(home.glob("*.before-restore-*"))
    assert [p.name.split(".")[0] for p in kept] == ["config", "data"]
    for folder in kept:
        root = folder.name.split(".")[0]
        assert digest_tree(folder) == {
            k.removeprefix(f"{root}/"): v for k, v in before.items() if k.startswith(f"{root}/")
        }
        assert f"kept as {folder}" in done.stderr.replace("\n", "")
    con = sqlite3.connect(home / "data" / "memory.db")
    assert con.execute("SELECT count(*) FROM ballast").fetchone()[0] == BALLAST_MIB
    con.close()
