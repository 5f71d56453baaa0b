"""Exactness on Gemma 3 270M (the second architecture), in its own process.

``python tests/support/gemma_check.py WORKDIR GGUF [DTYPE]`` dequantizes the Gemma 3 270M GGUF
of the test-model packages into a model folder as the product does for any GGUF, then prints
the report of :func:`tests.support.injection_check.run_checks` as one JSON line, with k=1 behind
a system prompt longer than the model's 512-token sliding window as well.

Gemma 3 is this design's hard case: sliding-window layers (RoPE base 1e4) interleaved with
global ones (base 1e6), keys after a k-norm, scaled embeddings, a base model without a chat
template (the plain layout of :data:`~inferscale_core.composer.PLAIN_CHAT_TEMPLATE`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

LONG_PREFIX_TOKENS = 640  # past the 512-token window of the sliding layers


def main(workdir: Path, gguf: Path, dtype: str = "auto") -> dict:
    from inferscale_core.model_files import resolve_model
    from tests.support.injection_check import run_checks

    model_dir = resolve_model(str(gguf), progress=False)
    return run_checks(
        model_dir, workdir, dtype, rope_type="gemma3", long_prefix_tokens=LONG_PREFIX_TOKENS
    )


if __name__ == "__main__":
    dtype = sys.argv[3] if len(sys.argv) > 3 else "auto"
    print(json.dumps(main(Path(sys.argv[1]), Path(sys.argv[2]), dtype)))
