"""Paths shared by the importer tests."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "exports"
#: The LoCoMo file lives in the ``shared`` folder next to the repository root.
LOCOMO_REAL = (
    Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "locomo" / "locomo10.json"
)
