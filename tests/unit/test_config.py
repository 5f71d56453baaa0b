"""The settings file: defaults, round trip, atomic save, and clear errors for bad values."""

from __future__ import annotations

import os
import stat

import pytest

from inferscale_core.config import AppConfig, ConfigError, load, save


def test_defaults_and_a_missing_file(tmp_path):
    config = load(tmp_path / "nope.toml")
    assert config == AppConfig()
    assert (config.model, config.k, config.w, config.gpu_pool_gib) == (None, 50, 20, 0)
    assert (config.profile, config.extractor) == ("default", "auto")


def test_save_and_load_round_trip(tmp_path):
    path = tmp_path / "sub" / "config.toml"
    config = AppConfig(model="/models/llama", k=5, w=8, gpu_pool_gib=2.5, profile="work")
    save(config, path)
    assert load(path) == config
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["config.toml"]  # no temporary left


def test_the_embedded_model_is_left_out_of_the_file(tmp_path):
    path = save(AppConfig(k=3), tmp_path / "config.toml")
    text = path.read_text()
    assert "model" not in text and "k = 3" in text
    assert load(path).model is None


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ("k = -1", ["k must be a whole number >= 0", "-1"]),
        ('k = "ten"', ["k must be a whole number", "'ten'"]),
        ("w = true", ["w must be a whole number"]),
        ("gpu_pool_gib = -2", ["gpu_pool_gib must be a number of GiB >= 0"]),
        ('extractor = "magic"', ["extractor must be one of auto, deterministic, llm"]),
        ('kv_cache_dtype = "fp4"', ["kv_cache_dtype must be one of auto, fp8", "'fp4'"]),
        ('profile = ""', ["profile must be a non-empty name"]),
        ('model = ""', ["model must be a model folder, a .gguf file"]),
        ("colour = 3", ["unknown setting(s) colour", "known: model, k, w"]),
        ("k = ", ["is not valid TOML", "fix or delete it"]),
    ],
)
def test_bad_values_are_explained(tmp_path, body, words):
    path = tmp_path / "config.toml"
    path.write_text(body + "\n")
    with pytest.raises(ConfigError) as info:
        load(path)
    message = str(info.value)
    assert str(path) in message
    for word in words:
        assert word in message


def test_a_failed_save_keeps_the_old_file(tmp_path, monkeypatch):
    path = save(AppConfig(k=1), tmp_path / "config.toml")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError):
        save(AppConfig(k=2), path)
    assert load(path).k == 1
    assert [p.name for p in tmp_path.iterdir()] == ["config.toml"]


def test_an_fp8_cache_keeps_its_entries_as_it_holds_them(tmp_path):
    """kv_store_dtype "auto" is "model" over an fp8 cache (already a byte an element, exact);
    a choice the user made stands."""
    path = tmp_path / "config.toml"
    path.write_text('kv_cache_dtype = "fp8"\n')
    assert load(path).store_dtype == "model"
    path.write_text('kv_cache_dtype = "fp8"\nkv_store_dtype = "int4"\n')
    assert load(path).store_dtype == "int4"
    assert load(tmp_path / "missing.toml").kv_cache_dtype == "auto"


def test_an_fp8_cache_has_a_store_of_its_own(tmp_path):
    """Its entries are fp8 values scaled as that cache holds them: another fingerprint, while
    "auto" leaves every existing store's fingerprint as it was."""
    from inferscale_core.fingerprint import model_fingerprint

    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    (tmp_path / "model.safetensors").write_bytes(b"0" * 10)
    plain = model_fingerprint(tmp_path)
    assert model_fingerprint(tmp_path, "auto") == plain
    assert model_fingerprint(tmp_path, "fp8") != plain
    assert len(model_fingerprint(tmp_path, "fp8")) == len(plain) == 16
