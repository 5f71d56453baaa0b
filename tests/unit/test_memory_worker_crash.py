"""SIGKILL during background encoding of 300 facts, then a restart: nothing lost or doubled."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from inferscale_core.factlog import FactLog
from inferscale_core.fingerprint import model_fingerprint
from tests.support import REPO, SUPPORT
from tests.support.hf_encoder import ORACLE_VERSION as ENCODER_VERSION

CHILD = SUPPORT / "memory_worker_child.py"
N_FACTS = 300  # killed after 100 encoded (32 a batch): the restart still has most to do


def _child(db: Path, store: Path, model: Path) -> subprocess.Popen:
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return subprocess.Popen(
        [sys.executable, str(CHILD), str(db), str(store), str(model)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=path),
    )


def _encoded(db: Path) -> int:
    log = FactLog.open(db)
    try:
        return log.db.execute("SELECT count(*) FROM kv_entries").fetchone()[0]
    finally:
        log.close()


@pytest.mark.slow
def test_sigkill_during_encoding_loses_and_duplicates_nothing(smollm2_path, tmp_path):
    db, store = tmp_path / "memory.db", tmp_path / "kv"
    log = FactLog.open(db)
    profile = log.profile("default")
    for i in range(N_FACTS):
        log.add_fact(profile, f"Fact {i}: the blue notebook number {i} is on shelf {i % 37}.")
    log.set_extraction_cursor(profile, 0)
    log.close()

    child = _child(db, store, smollm2_path)
    deadline = time.monotonic() + 300
    while _encoded(db) < 100 and time.monotonic() < deadline and child.poll() is None:
        time.sleep(0.2)
    before_kill = _encoded(db)
    assert 0 < before_kill < N_FACTS, "the kill must land mid-way"
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    at_kill = _encoded(db)  # the kill may land after a few more batches
    assert at_kill < N_FACTS

    rerun = _child(db, store, smollm2_path)
    out, err = rerun.communicate(timeout=900)
    assert rerun.returncode == 0, err[-3000:]
    print(f"killed after {before_kill} encoded; the restart encoded {out.split()[-1]} more")

    log = FactLog.open(db)
    fingerprint = model_fingerprint(smollm2_path)
    rows = log.db.execute(
        "SELECT fact_id, location FROM kv_entries WHERE model_fingerprint = ? AND w = 0"
        " AND encoder_version = ?",
        (fingerprint, ENCODER_VERSION),
    ).fetchall()
    assert len(rows) == N_FACTS  # every fact encoded once (primary key forbids doubles)
    assert len({fact_id for fact_id, _ in rows}) == N_FACTS
    assert log.facts_without_kv(profile, fingerprint, 0, ENCODER_VERSION) == []
    files = {p.stem for p in store.glob("*.safetensors")}
    assert {location for _, location in rows} <= files  # every row's tensors exist
    assert not list(store.glob(".tmp-*"))  # no half-written entry survives
    restarted = int(out.split()[-1])  # what the second run encoded: exactly what was left
    assert restarted == N_FACTS - at_kill
    log.close()
