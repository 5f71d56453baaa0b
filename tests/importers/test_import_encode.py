"""``import --encode``: imported turns go through extraction and encoding, with progress."""

from __future__ import annotations

import os
import subprocess
import sys

from inferscale_core import paths
from inferscale_core.context_window import ANCHORED, encoding_version
from inferscale_core.encoding import ENCODER_VERSION
from inferscale_core.factlog import FactLog
from inferscale_core.fingerprint import model_fingerprint
from tests.support import FIXTURES, REPO

EXPORT = FIXTURES / "whatsapp"


def test_import_then_encode_makes_every_fact_injectable(smollm2_path, tmp_path):
    home = tmp_path / "home"
    env = dict(os.environ, INFERSCALE_HOME=str(home), PYTHONPATH=str(REPO))
    env[paths.CACHE_ENV] = str(smollm2_path.parents[1])  # the shared model cache
    done = subprocess.run(
        [sys.executable, "-m", "app", "import", "--encode", str(EXPORT)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "encoded" in done.stderr and "errors: 0" in done.stderr
    log = FactLog.open(home / "data" / "memory.db")
    profile = log.profile("default")
    facts = log.active_facts(profile)
    assert facts, "the WhatsApp fixture has substantive turns"
    fingerprint = model_fingerprint(smollm2_path)
    anchored = encoding_version(ENCODER_VERSION, 20, ANCHORED)  # the default window
    assert log.facts_without_kv(profile, fingerprint, 20, anchored) == []
    assert log.deferred_kv(profile) == {}  # --encode: none left to encode when retrieved
    keys = log.kv_keys_for([f.id for f in facts], fingerprint, 20, anchored)
    assert set(keys) == {f.id for f in facts}
    assert log.extraction_cursor(profile) == max(t for t, _ in log.turns(profile))
    log.close()
