"""Helpers the tests share: the HF oracle, child-process scripts, repository paths."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "exports"
SUPPORT = REPO / "tests" / "support"
LOCOMO_FIXTURE = REPO / "tests" / "fixtures" / "locomo" / "locomo_fixture.json"
