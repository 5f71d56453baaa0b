"""SIGKILL during eviction: every recorded entry's file is still whole, and no fact is lost.

A child process encodes and evicts in a loop (tests/support/eviction_child.py, the worker's
own eviction); it is killed at several moments. The rows go before the files, so a kill
between them can leave a file no row names, never a row without its file."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from inferscale_core.factlog import FactLog
from inferscale_core.kvstore import KVStore
from tests.support import REPO, SUPPORT
from tests.support.eviction_child import FINGERPRINT

CHILD = SUPPORT / "eviction_child.py"
N_FACTS = 60
BUDGET_ENTRIES = 20
KILLS = 6


def _child(db: Path, store: Path) -> subprocess.Popen:
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return subprocess.Popen(
        [sys.executable, str(CHILD), str(db), str(store), str(BUDGET_ENTRIES)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=path),
    )


def _check(db: Path, root: Path, texts: dict[int, str]) -> tuple[int, int]:
    """Every row's file reads back whole; every fact is active with its text. Returns
    (rows, files no row names)."""
    store = KVStore(root, fingerprint=FINGERPRINT)  # a fresh process's view
    with FactLog.open(db) as log:
        rows = log.db.execute(
            "SELECT location, nbytes FROM kv_entries WHERE model_fingerprint = ?", (FINGERPRINT,)
        ).fetchall()
        for location, nbytes in rows:
            assert store.has(location), f"{location} is recorded but its file is gone"
            assert store.header(location).nbytes == nbytes  # whole file, checksums checked
            assert store.get(location).k.shape[1] == store.header(location).shape[1]
        facts = log.active_facts(log.profile("default"))
        assert {f.id: f.text for f in facts} == texts  # no fact lost or changed
    return len(rows), len(set(store.keys()) - {location for location, _ in rows})


def test_sigkill_during_eviction_leaves_no_recorded_entry_without_its_file(tmp_path):
    db, root = tmp_path / "memory.db", tmp_path / "kv"
    with FactLog.open(db) as log:
        profile = log.profile("default")
        for i in range(N_FACTS):
            log.add_fact(profile, f"Fact {i}: the red notebook number {i} is on shelf {i % 7}.")
        texts = {f.id: f.text for f in log.active_facts(profile)}
    rng = random.Random(34)
    for _ in range(KILLS):
        child = _child(db, root)
        assert child.stdout is not None
        first = child.stdout.readline()  # a whole encode + evict round done
        assert first.startswith("round"), child.stderr.read()[-3000:] if child.stderr else ""
        time.sleep(rng.uniform(0.05, 0.6))  # then anywhere in a later round
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        rows, orphans = _check(db, root, texts)
        assert 0 < rows <= N_FACTS
    print(f"{KILLS} kills; {orphans} unrecorded files after the last")
