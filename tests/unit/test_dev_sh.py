"""``packaging/dev.sh extra``: which engine setup installs, from a faked ``nvidia-smi -L``.

Real bash, real script; only the GPU probe is replaced (``INFERSCALE_GPU_PROBE``), so nothing is
installed and the answer does not depend on this machine's hardware.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support import REPO

H200 = "GPU 0: NVIDIA H200 (UUID: GPU-5f2c0000-0000-0000-0000-000000000000)"


def _probe(tmp_path: Path, out: str, code: int) -> str:
    """An executable standing in for ``nvidia-smi -L``."""
    (tmp_path / "said.txt").write_text(out + "\n" if out else "")
    script = tmp_path / "fake-nvidia-smi"
    script.write_text(f"#!/bin/sh\ncat '{tmp_path / 'said.txt'}'\nexit {code}\n")
    script.chmod(0o755)
    return str(script)


def _extra(probe: str, **env: str) -> tuple[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("INFERSCALE_")}
    done = subprocess.run(
        ["bash", str(REPO / "packaging" / "dev.sh"), "extra"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**base, "INFERSCALE_GPU_PROBE": probe, **env},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip(), done.stderr


def test_a_machine_with_an_nvidia_gpu_gets_the_gpu_engine(tmp_path):
    extra, said = _extra(_probe(tmp_path, H200, 0))
    assert extra == "gpu"
    assert "lists 1 NVIDIA GPU" in said  # the user is told why


@pytest.mark.parametrize(
    ("out", "code"),
    [
        ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", 9),
        ("No devices were found", 6),
        ("", 0),  # succeeds but lists no GPU
        (H200, 1),  # lists one but fails
    ],
    ids=["no-driver", "no-devices", "empty", "failed"],
)
def test_no_usable_gpu_gets_the_cpu_engine(tmp_path, out, code):
    extra, said = _extra(_probe(tmp_path, out, code))
    assert extra == "cpu"
    assert "no NVIDIA GPU found" in said


def test_a_missing_nvidia_smi_gets_the_cpu_engine(tmp_path):
    assert _extra(str(tmp_path / "nowhere" / "nvidia-smi"))[0] == "cpu"


def test_an_explicit_extra_wins_over_the_probe(tmp_path):
    gpu = _probe(tmp_path, H200, 0)
    extra, said = _extra(gpu, INFERSCALE_EXTRA="cpu")
    assert extra == "cpu" and "INFERSCALE_EXTRA" in said
    assert _extra("false", INFERSCALE_EXTRA="gpu")[0] == "gpu"


def test_an_unknown_extra_is_refused():
    done = subprocess.run(
        ["bash", str(REPO / "packaging" / "dev.sh"), "extra"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "INFERSCALE_EXTRA": "tpu"},
    )
    assert done.returncode == 2 and "cpu or gpu" in done.stderr
