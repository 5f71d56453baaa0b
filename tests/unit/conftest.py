"""Fixtures several unit modules share (a module that needs another ``home`` defines its own)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home and a model cache of the test's own (its registry), no Ollama store."""
    monkeypatch.setenv("INFERSCALE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("INFERSCALE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "no-ollama"))
    return tmp_path / "home"
