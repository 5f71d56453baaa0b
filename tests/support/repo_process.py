"""Run a script or module of the repository in a fresh Python: a second vLLM engine needs a
process of its own (one engine per pytest session)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_python(
    args: list[str], timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` from the repository root, with the repository importable and vLLM's
    log at WARNING (``env``: the environment, default this process's); stdout and stderr
    captured as text."""
    base = os.environ if env is None else env
    path = os.pathsep.join(filter(None, [str(REPO), base.get("PYTHONPATH")]))
    env = dict(base, VLLM_LOGGING_LEVEL="WARNING", PYTHONPATH=path)
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO
    )
