"""The GPU machine's SmolLM2 entry points (``bench/gpu_locomo.py``, ``bench/gpu_kvquant.py``)
run here on the CPU, in a process of their own, on two of the test fixture's questions."""

from __future__ import annotations

import subprocess
from pathlib import Path

from bench import locomo
from tests.support import LOCOMO_FIXTURE
from tests.support.repo_process import run_python


def run_on_exported_hits(
    module: str, tmp_path: Path, *more: str
) -> tuple[subprocess.CompletedProcess[str], Path, Path]:
    """``python -m MODULE OUT`` with the arguments they share (bench/gpu_smollm2.py): the
    embedded GGUF, hits exported for 2 questions at k=2, the fixture, folders under
    ``tmp_path``; then ``more``. Returns the finished process, OUT and the hits file."""
    from inferscale_core.model_files import smollm2_gguf

    hits = tmp_path / "hits.json"
    locomo.export_retrieval(LOCOMO_FIXTURE, hits, sample=2, k=2)
    out = tmp_path / "out"
    shared = ["--gguf", str(smollm2_gguf()), "--retrieval", str(hits)]
    shared += ["--data", str(LOCOMO_FIXTURE), "--model-dir", str(tmp_path / "smollm2")]
    shared += ["--store", str(tmp_path / "kv"), "--sample", "2"]
    done = run_python(["-m", module, str(out), *shared, *more], timeout=900)
    return done, out, hits
