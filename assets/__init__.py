"""Static files shipped with the package: Textual styles (tcss), prompts and icons."""

from importlib.resources import files
from pathlib import Path


def asset_path(*parts: str) -> Path:
    """Path of a shipped asset, e.g. ``asset_path("prompts", "system.txt")``."""
    return Path(str(files(__name__).joinpath(*parts)))


def read_asset(*parts: str) -> str:
    return asset_path(*parts).read_text(encoding="utf-8")
