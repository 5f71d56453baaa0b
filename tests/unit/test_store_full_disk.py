"""A full disk during a KV entry's write: one clear message, nothing lost.

The disk really refuses: a child process under RLIMIT_FSIZE gets EFBIG from write(), and a
tiny tmpfs (where this test may mount one) gets ENOSPC. The store raises StoreFullError, the
old entry stays readable, no temporary file is left, and the memory worker shows the message
(not a traceback), keeps the facts pending or the entries listed, and catches up once space
is freed.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
import sys
import time
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


def _wait(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert condition()


def test_the_memory_worker_on_a_full_disk_says_so_and_catches_up(smollm2_path, tmp_path):
    from transformers import AutoTokenizer

    from inferscale_core.composer import ChatLayout
    from inferscale_core.extractor import DeterministicExtractor
    from inferscale_core.factlog import FactLog
    from inferscale_core.fingerprint import model_fingerprint
    from inferscale_core.memory_worker import MemoryWorker
    from inferscale_core.prompt_builder import PromptBuilder
    from tests.support.hf_encoder import ORACLE_VERSION, HFReferenceEncoder

    poll = 0.2
    db = tmp_path / "memory.db"
    fingerprint = model_fingerprint(smollm2_path)
    with _tmpfs(tmp_path / "kv", "8m") as root:
        store = KVStore(root, fingerprint=fingerprint, store_dtype="model")
        encoder = HFReferenceEncoder(smollm2_path, fingerprint)  # writes in this thread
        encoder.store = store
        layout = ChatLayout(AutoTokenizer.from_pretrained(str(smollm2_path)), "System.")
        builder = PromptBuilder(layout, encoder, store, batch_size=8)
        with FactLog.open(db) as log:
            profile = log.profile("default")
            for text in ("Ines moved to Lisbon.", "Miso is a grey cat.", "Jun teaches in Osaka."):
                log.add_fact(profile, text)
            log.set_extraction_cursor(profile, 0)

        def worker() -> MemoryWorker:
            return MemoryWorker(
                lambda: FactLog.open(db),
                profile,
                builder,
                store,
                DeterministicExtractor(),
                w=0,
                poll_seconds=poll,
            ).start()

        def pending() -> int:
            with FactLog.open(db) as log:
                return len(log.facts_without_kv(profile, fingerprint, 0, ORACLE_VERSION))

        # encoding: the disk is full
        filler = _fill(root, leave=64 << 10)  # a SmolLM2 fact in fp32 is ~45 KiB a token
        first = worker()
        try:
            _wait(lambda: first.stats.errors > 0)
            errors = first.stats.errors
            time.sleep(1.0)
            message = first.stats.last_error
            assert message.startswith("StoreFullError: The disk is full"), message
            _assert_clear(message.removeprefix("StoreFullError: "))
            # said once (one error, a flag the footer shows), retried less and less often
            assert first.stats.disk_full and first.stats.errors == errors == 1
            assert pending() == 3 and store.keys() == []
            assert _leftovers(root) == [".filler"]
            filler.unlink()
            assert first.wait_idle(timeout=120)  # its wake tries again at once
            assert pending() == 0 and first.stats.encoded_facts == 3
            assert not first.stats.disk_full
        finally:
            first.stop()

        # conversion to int4: the disk is full
        store.store_dtype = "int4"
        filler = _fill(root, leave=16 << 10)  # an int4 fact is ~7 KiB a token
        second = worker()
        try:
            _wait(lambda: second.stats.errors > 0)
            time.sleep(3 * poll)  # a few more tries
            assert second.stats.last_error.startswith("StoreFullError: The disk is full")
            assert second.stats.to_convert == 3 and second.stats.converted == 0
            entries = store.keys()
            assert len(entries) == 3
            assert all(store.stored_scheme(key) == "model" for key in entries)
            assert _leftovers(root) == [".filler"]
            filler.unlink()
            assert second.wait_idle(timeout=120)
        finally:
            second.stop()
        assert (second.stats.to_convert, second.stats.converted) == (0, 3)
        reread = KVStore(root, fingerprint=fingerprint)
        assert [reread.header(key).scheme for key in entries] == ["int4"] * 3
