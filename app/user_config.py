"""The user's config file for the commands: loaded once, errors told plainly."""

from __future__ import annotations

from rich.console import Console

from inferscale_core import paths
from inferscale_core.config import AppConfig, ConfigError, load


def load_config(console: Console) -> AppConfig | None:
    """The settings in ``paths.config_file()``, or None after printing what is wrong."""
    try:
        return load(paths.config_file())
    except ConfigError as exc:
        console.print(f"[red]error:[/red] {exc}", soft_wrap=True, highlight=False)
        return None
