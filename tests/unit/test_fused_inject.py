"""The fused injection kernel (one Triton kernel: re-rotation + cache writes of all layers).

On CPU it runs under Triton's interpreter (``TRITON_INTERPRET=1``, in a child process because
the flag is read when kernels are defined); on a CUDA machine the compiled kernel runs too.
The reference: ``rope.shift`` per piece, then ``scatter_kv`` (tests/support/paged_reference.py).
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from inferscale_core.rope import RopeSpec
from inferscale_core.vllm_plugin.fused_inject import FusedInjector, SourcePiece
from inferscale_core.vllm_plugin.paged_layouts import PagedLayout
from tests.support import REPO as ROOT
from tests.support import SUPPORT

CASES = SUPPORT / "fused_inject_cases.py"


def _check(results: dict, direct_launch: bool) -> None:
    assert len(results) == 30  # 3 layouts x 5 RoPE variants x 2 dtypes
    for name, case in results.items():
        # One rounding from fp32 either way: at most one unit in the last place. (The
        # interpreter truncates fp32 -> bf16 where a GPU rounds, still within one ulp.)
        assert case["k_error_ulps"] <= 1.0, (name, case)
        assert case["v_equal"], name
        assert case["only_slots_written"], name
        assert case["in_place_equal"], name  # the pool's path writes the very same bytes
        assert case["zero_shift_exact"], name  # a shift of 0 writes back the stored bytes
        assert case["direct_launch"] is direct_launch, name  # compiled kernels only, on CUDA


def test_kernel_matches_the_unfused_path_under_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(CASES), "cpu"], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, (done.returncode, done.stdout[-2000:], done.stderr[-3000:])
    _check(json.loads(done.stdout.splitlines()[-1]), direct_launch=False)


def check_compressed(results: dict) -> None:
    assert len(results) == 60  # 3 layouts x 5 RoPE variants x 2 dtypes x (int4, fp8)
    for name, case in results.items():
        # codes expanded, rotated in fp32, one rounding: as the torch path in fp32, rounded once
        for path in ("", "in_place_"):  # staged tensors, and read where the pool holds them
            assert case[f"{path}k_error_ulps"] <= 1.0, (name, path, case)
            assert case[f"{path}v_error_ulps"] <= 1.0, (name, path, case)
            assert case[f"{path}only_slots_written"], (name, path)


def test_compressed_kernel_matches_expanding_then_rotating_under_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(SUPPORT / "fused_compressed_cases.py"), "cpu"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, (done.returncode, done.stdout[-2000:], done.stderr[-3000:])
    check_compressed(json.loads(done.stdout.splitlines()[-1]))


def _injector() -> FusedInjector:
    spec = RopeSpec(16, 16, tuple([1.0] * 8), 1.0, True, "default")
    caches = [torch.zeros(2, 4, 4, 2, 16) for _ in range(2)]  # [2, blocks, bs, heads, dim]
    return FusedInjector(caches, PagedLayout.KV_FIRST, 4, 2, 16, spec)


def _piece(tokens: int, src: tuple[int, int], dst: int) -> SourcePiece:
    k = torch.zeros(2, tokens, 2, 16)  # [layers, tokens, heads, dim]
    return SourcePiece(k, k.clone(), src[0], src[1], dst)


def test_pieces_must_tile_the_span_exactly_once():
    injector = _injector()
    with pytest.raises(ValueError, match="cover 3 tokens of a 4-token span"):
        injector.inject([_piece(5, (0, 3), 0)], 0, 4, [0])
    with pytest.raises(ValueError, match="tile"):  # right count, but overlapping
        injector.inject([_piece(5, (0, 2), 0), _piece(5, (0, 2), 1)], 0, 4, [0])
    with pytest.raises(ValueError, match="tile"):  # right count, but a gap
        injector.inject([_piece(5, (0, 2), 0), _piece(5, (0, 2), 3)], 0, 4, [0, 1])


def test_the_block_table_must_reach_the_end_of_the_span():
    with pytest.raises(ValueError, match="1 blocks do not reach position 5"):
        _injector().inject([_piece(6, (0, 6), 0)], 0, 6, [0])


def test_refuses_entries_of_another_shape_and_unlike_caches():
    injector = _injector()
    wrong_heads = SourcePiece(torch.zeros(2, 4, 3, 16), torch.zeros(2, 4, 3, 16), 0, 4, 0)
    with pytest.raises(ValueError, match="does not fit 2 layers of 2 heads x 16"):
        injector.inject([wrong_heads], 0, 4, [0])
    spec = RopeSpec(16, 16, tuple([1.0] * 8), 1.0, True, "default")
    unlike = [torch.zeros(2, 4, 4, 2, 16), torch.zeros(2, 5, 4, 2, 16)]
    with pytest.raises(ValueError, match="alike"):
        FusedInjector(unlike, PagedLayout.KV_FIRST, 4, 2, 16, spec)
