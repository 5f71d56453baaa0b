"""A full disk during a KV entry's write: one clear message, nothing lost.

The disk really refuses: a child process under RLIMIT_FSIZE gets EFBIG from write(), and a
tiny tmpfs (where this test may mount one) gets ENOSPC. The store raises StoreFullError, the
old entry stays readable, and no temporary file is left.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from inferscale_core.kvstore import KVStore, StoreFullError
from inferscale_core.types import FactKV
from tests.support import REPO, SUPPORT


def _assert_clear(message: str) -> None:
    """The user's message: what failed, how much, where, and that nothing is lost."""
    assert message.startswith("The disk is full: a memory's KV (")
    assert " MB) could not be written to " in message
    assert "the fact stays in the fact log and goes in as text until space is freed" in message
    assert "Traceback" not in message and "SafetensorError" not in message


def _leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("."))


def test_a_write_over_the_file_size_limit_raises_store_full_and_keeps_the_old(tmp_path):
    root = tmp_path / "kv"
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, str(SUPPORT / "full_disk_child.py"), str(root)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=path),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    for what in ("new", "replace", "convert", "wait_for"):
        assert seen[what]["error"] == "StoreFullError", (what, seen[what])
        assert seen[what]["errno"] == errno.EFBIG
        _assert_clear(seen[what]["message"])
        assert str(root) in seen[what]["message"]
    assert seen["wait_for"]["seconds"] < 10  # told at once, not after the 60 s timeout
    assert seen["old_scheme"] == "model" and seen["old_intact"]
    assert sorted(p.stem for p in root.glob("*.safetensors")) == ["fact-old"]
    assert _leftovers(root) == []  # the partial temporary files were removed


@contextlib.contextmanager
def _tmpfs(where: Path, size: str):
    """A tmpfs of ``size`` mounted at ``where``; skips the test where mounting is refused."""
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _fill(root: Path, leave: int) -> Path:
    """Take all but ``leave`` bytes of the file system holding ``root``."""
    st = os.statvfs(root)
    filler = root / ".filler"
    with open(filler, "wb") as fh:
        fh.write(b"\0" * max(0, st.f_bavail * st.f_frsize - leave))
    return filler


def _entry(key: str, seed: int, tokens: int = 24) -> FactKV:
    gen = torch.Generator().manual_seed(seed)
    k, v = torch.randn(2, 4, tokens, 2, 64, generator=gen)  # [layers, tokens, heads, dim]
    return FactKV(key, list(range(tokens)), k, v, "fp")  # 96 KiB of K and V in fp32


def test_no_space_left_raises_store_full_and_keeps_the_old(tmp_path):
    with _tmpfs(tmp_path / "kv", "1m") as root:
        store = KVStore(root, fingerprint="fp", store_dtype="model")
        old = _entry("fact-old", 1)
        store.put(old)
        filler = _fill(root, leave=8 << 10)
        for attempt in (
            lambda: store.put(_entry("fact-new", 2)),
            lambda: store.put(_entry("fact-old", 3)),  # a replacement
            lambda: store.convert("fact-old", "int4"),  # int4: ~14 KiB
        ):
            with pytest.raises(StoreFullError) as caught:
                attempt()
            assert caught.value.errno == errno.ENOSPC
            _assert_clear(str(caught.value))
            assert _leftovers(root) == [".filler"]
        reread = KVStore(root, fingerprint="fp")
        assert reread.stored_scheme("fact-old") == "model"
        assert torch.equal(reread.get("fact-old").k, old.k)
        assert reread.keys() == ["fact-old"]
        filler.unlink()  # space freed: the same writes go through
        assert store.convert("fact-old", "int4")
        store.put(_entry("fact-new", 2))
        assert KVStore(root, fingerprint="fp").keys() == ["fact-new", "fact-old"]
