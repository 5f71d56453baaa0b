"""``bench/load_probe.py``: the GPU host's load, part by part (run by gpu_run.sh's tests)."""

import pytest
import torch

from bench.diagnose import load_probe


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is here: the real probe runs below")
def test_without_cuda_it_says_it_needs_a_gpu(tmp_path):
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        load_probe.main(tmp_path)
    assert not (tmp_path / "load_probe.json").exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the probe measures a CUDA host")
def test_probe_times_every_part_and_the_host_tier(tmp_path):
    result = load_probe.main(tmp_path)
    issue = result["issue_us"]
    assert set(issue) == {
        "pool_lookup",
        "inject_in_place",
        "per_piece_array",
        "inject_in_place_triton_launch",
    }
    assert all(value > 0 for value in issue.values())
    assert issue["inject_in_place"] > issue["per_piece_array"]  # one of its parts
    host = result["host_tier_ms"]
    assert host["entries_pinned"] is True
    # Copies cannot beat one copy of all the bytes; the time to done bounds the CPU time.
    assert host["prefetch_cpu_done_ms"][1] >= 0.9 * host["one_copy_cpu_done_ms"][1]
    assert (tmp_path / "load_probe.json").exists()
