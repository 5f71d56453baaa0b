"""The fused injection kernel compiled for CUDA against the reference path (the interpreter
runs the same cases on the CPU in tests/unit/test_fused_inject.py)."""

from __future__ import annotations

from tests.unit.test_fused_inject import _check


def test_compiled_kernel_matches_the_unfused_path_on_cuda():
    from tests.support.fused_inject_cases import run_all

    _check(run_all("cuda"), direct_launch=True)


def test_compiled_compressed_kernel_matches_expanding_then_rotating_on_cuda():
    from tests.support.fused_compressed_cases import run_all as run_compressed
    from tests.unit.test_fused_inject import check_compressed

    check_compressed(run_compressed("cuda"))
