"""SIGKILL during the conversion of a store, several times: every entry the fact log records
reads back whole (a valid header and checksum), in the old scheme or the new, never half
written, and no temporary file passes for an entry."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path

import torch

from inferscale_core.factlog import FactLog
from inferscale_core.kvstore import KVStore
from inferscale_core.types import FactKV
from tests.support import REPO, SUPPORT

CHILD = SUPPORT / "convert_child.py"
N_ENTRIES = 240
KILLS = 5


def _entry(i: int) -> FactKV:
    gen = torch.Generator().manual_seed(i)
    tokens = 16 + i % 17
    k, v = torch.randn(2, 6, tokens, 2, 64, generator=gen)  # [layers, tokens, heads, dim]
    return FactKV(f"fact-{i:04d}", list(range(tokens)), k, v, "fp")


def _child(store: Path, keys: list[str]) -> subprocess.Popen:
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return subprocess.Popen(
        [sys.executable, str(CHILD), str(store), *keys],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=path),
    )


def _check(root: Path, recorded: dict[str, FactKV]) -> dict[str, int]:
    """Every recorded entry, read by a fresh store (whole file, checksum), is the original
    (model) or its conversion (int4); the store's keys are exactly the recorded ones."""
    store = KVStore(root, fingerprint="fp")
    schemes = {"model": 0, "int4": 0}
    for key, original in recorded.items():
        header = store.header(key)  # reads the whole file: header, shapes, CRC-32
        entry = store.get(key)
        assert header.scheme in schemes, (key, header.scheme)
        if header.scheme == "model":
            assert torch.equal(entry.k, original.k) and torch.equal(entry.v, original.v)
        else:
            assert entry.quant is not None and entry.quant.scheme == "int4"
        assert list(entry.token_ids) == original.token_ids
        schemes[header.scheme] += 1
    assert store.lost() == []  # nothing damaged was set aside
    assert store.keys() == sorted(recorded)  # no temporary file taken for an entry
    names = {p.name for p in root.iterdir()}
    strays = {n for n in names if not n.startswith(".")} - {f"{k}.safetensors" for k in recorded}
    assert strays == set()
    assert all(n.startswith(".tmp-") for n in names if n.startswith("."))
    return schemes


def test_sigkill_during_conversion_leaves_every_entry_whole(tmp_path):
    root, db = tmp_path / "kv", tmp_path / "memory.db"
    store = KVStore(root, fingerprint="fp", store_dtype="model")
    recorded = {}
    with FactLog.open(db) as log:
        profile = log.profile("default")
        for i in range(N_ENTRIES):
            entry = _entry(i)
            fact_id, _ = log.add_fact(profile, f"Fact {i}: notebook {i} is on shelf {i % 37}.")
            store.put(entry)
            log.record_kv(fact_id, "fp", 0, "v", entry.key, len(entry.token_ids), entry.nbytes)
            recorded[entry.key] = entry
    with FactLog.open(db) as log:
        rows = log.db.execute("SELECT location FROM kv_entries").fetchall()
    assert sorted(key for (key,) in rows) == sorted(recorded)

    rng = random.Random(34)
    keys = sorted(recorded)
    history = []
    for _ in range(KILLS):
        child = _child(root, keys)
        assert child.stdout.readline().strip() == "started", child.stderr.read()[-3000:]
        # by progress, not by the clock (a fast machine converts all 240 in a fraction of a
        # second): after 1-30 conversions, then a moment into the next one
        for _ in range(rng.randint(1, 30)):
            assert child.stdout.readline().strip() == "converted", child.stderr.read()[-3000:]
        time.sleep(rng.uniform(0.0, 0.003))
        child.kill()
        child.wait(timeout=30)
        history.append(_check(root, recorded))
    print(f"after each kill, (model, int4): {[tuple(s.values()) for s in history]}")
    assert history[0]["int4"] > 0, "the first kill landed before any conversion"
    assert history[-1]["model"] > 0, "the conversion finished before the last kill"
    assert any(s["int4"] < history[-1]["int4"] for s in history[:-1])  # kills landed mid-way

    child = _child(root, keys)
    out, err = child.communicate(timeout=300)
    assert child.returncode == 0, err[-3000:]
    assert _check(root, recorded) == {"model": 0, "int4": N_ENTRIES}
