"""Exactness on a tiny random Llama with Llama-3.1 RoPE scaling, in its own process.

A pytest session may hold one vLLM engine (the SmolLM2 one), so this check runs as a script:
``python tests/support/tiny_llama_check.py WORKDIR TOKENIZER_DIR [DTYPE]`` builds a 2-layer random
Llama with ``rope_type="llama3"`` and prints the report of :func:`tests.support.injection_check.
run_checks` on it as one JSON line (what it measures: that module's docstring).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path


def make_tiny_llama(folder: Path, tokenizer_dir: Path) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # head_dim 32, grouped-query attention
        max_position_embeddings=4096,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        initializer_range=0.08,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, folder / name)
    return folder


def main(workdir: Path, tokenizer_dir: Path, dtype: str = "auto") -> dict:
    from tests.support.injection_check import run_checks

    model_dir = make_tiny_llama(workdir / "tiny-llama", tokenizer_dir)
    return run_checks(model_dir, workdir, dtype, rope_type="llama3")


if __name__ == "__main__":
    dtype = sys.argv[3] if len(sys.argv) > 3 else "auto"
    print(json.dumps(main(Path(sys.argv[1]), Path(sys.argv[2]), dtype)))
