"""Tests that need an NVIDIA GPU (CUDA): run on the H200 by ``bench/gpu_run.sh``; skipped,
with the reason, everywhere else."""

import pytest
import torch


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (tests/gpu/ runs on the H200)")
    for item in items:
        if "tests/gpu/" in item.nodeid:
            item.add_marker(skip)
