"""Exactness on SmolLM2 as a 4-bit folder (its GGUF's codes, gguf_int4.py), in its own process.

``python tests/support/int4_check.py WORKDIR`` writes the compressed-tensors W4A16 folder of the
embedded Q4_1 GGUF into WORKDIR and prints one JSON line: the folder's facts and the report of
:func:`tests.support.injection_check.run_checks` on it in bfloat16 (the 4-bit kernels' dtype).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(workdir: Path) -> None:
    from inferscale_core.gguf_int4 import write_int4_folder
    from inferscale_core.model_files import smollm2_gguf
    from tests.support.injection_check import run_checks

    folder = workdir / "smollm2-int4"
    folder.mkdir(parents=True)
    info = write_int4_folder(smollm2_gguf(), folder, name="smollm2-int4")
    size = sum(p.stat().st_size for p in folder.iterdir())
    report = run_checks(folder, workdir / "run", dtype="bfloat16")
    print(json.dumps({**report, "folder_bytes": size, "max_abs_error": info["max_abs_error"]}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
