"""The fast GGUF header reader (gguf_header.py) against the ``gguf`` package's own reader."""

from __future__ import annotations

import time
from pathlib import Path

import gguf
import pytest

from inferscale_core.gguf_header import GGUFHeaderError, read_header
from inferscale_core.model_files import smollm2_gguf
from tests.support.tiny_gguf import write_gguf


@pytest.mark.parametrize("which", ["smollm2", "tiny"])
def test_the_same_tensors_and_offsets_as_gguf_reader(tmp_path: Path, which: str) -> None:
    path = smollm2_gguf() if which == "smollm2" else write_gguf(tmp_path / "t.gguf", "Q4_K", 15)
    reader = gguf.GGUFReader(path)
    header = read_header(path)
    assert [(t.name, t.type_id, t.offset, t.shape) for t in header.tensors] == [
        (t.name, int(t.tensor_type), int(t.data_offset), tuple(int(d) for d in t.shape))
        for t in reader.tensors
    ]
    assert header.metadata["general.architecture"] == "llama"
    assert header.metadata["general.file_type"] == reader.get_field("general.file_type").contents()


def test_smollm2s_header_reads_fast() -> None:
    """On every start (resolve_model): gguf.GGUFReader takes 4-6 s for SmolLM2 here."""
    read_header(smollm2_gguf())
    start = time.perf_counter()
    header = read_header(smollm2_gguf())
    assert time.perf_counter() - start < 1.0
    assert header.metadata["tokenizer.ggml.tokens"] == 49152  # an array: its length


@pytest.mark.parametrize("keep", [3, 5000, 1_500_000])
def test_a_header_cut_short_is_refused(tmp_path: Path, keep: int) -> None:
    cut = tmp_path / "cut.gguf"
    with open(smollm2_gguf(), "rb") as src:
        cut.write_bytes(src.read(keep))
    with pytest.raises(GGUFHeaderError, match="runs past the end"):
        read_header(cut)
