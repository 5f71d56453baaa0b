"""Where the assistant keeps its files.

Per-user folders come from :mod:`platformdirs` for the app name ``inferscale-assistant``.
When the environment variable ``INFERSCALE_HOME`` is set, all three live under it instead
(``$INFERSCALE_HOME/data``, ``/cache``, ``/config``); tests and CI use that to stay out of the
real home directory. ``INFERSCALE_CACHE`` moves the cache folder alone (the tests keep their data
in a temporary home but share the dequantized model with the user's cache).

Every function creates its folder (mode 0700: memories are private) when it does not exist
yet, and reads the environment on each call, so a test may change ``INFERSCALE_HOME`` freely.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "inferscale-assistant"
HOME_ENV = "INFERSCALE_HOME"
CACHE_ENV = "INFERSCALE_CACHE"  # overrides the cache folder alone (tests share the model cache)
CONFIG_FILENAME = "config.toml"
DIR_MODE = 0o700


def private_dir(path: Path) -> Path:
    """``path``, each folder of it that is missing made 0700 (``mkdir(parents=True)`` makes
    the parents with the umask's mode, 0755 mostly)."""
    for folder in [*reversed(path.parents), path]:
        if not folder.exists():
            folder.mkdir(mode=DIR_MODE, exist_ok=True)
    return path


_ensure = private_dir


def _home() -> Path | None:
    home = os.environ.get(HOME_ENV)
    return Path(home).expanduser().absolute() if home else None


def data_dir() -> Path:
    """Persistent data: the memory database and its KV store."""
    home = _home()
    if home is not None:
        return _ensure(home / "data")
    return _ensure(Path(platformdirs.user_data_dir(APP_NAME, appauthor=False)))


def memory_db() -> Path:
    """The fact log: conversations, turns, facts and what encodes them (SQLite)."""
    return data_dir() / "memory.db"


def inbox_dir(configured: str | Path | None = None) -> Path:
    """The folder watched for chat exports to import (created 0700 when first watched).

    Args:
        configured: the config's ``inbox`` (``~`` is expanded); ``None`` or empty means
            ``data_dir()/inbox``.
    """
    if configured:
        return Path(configured).expanduser().absolute()
    return data_dir() / "inbox"


def kv_dir() -> Path:
    """The KV store: one folder per model fingerprint under it (created 0700 here, since the
    store creates only the fingerprint folder with that mode)."""
    return _ensure(data_dir() / "kv")


def cache_dir() -> Path:
    """Rebuildable data: the dequantized model, compiled artefacts."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return _ensure(Path(override).expanduser().absolute())
    home = _home()
    if home is not None:
        return _ensure(home / "cache")
    return _ensure(Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False)))


def runtime_dir() -> Path:
    """Sockets of the running assistant: ``$XDG_RUNTIME_DIR/inferscale-assistant`` (the
    session's private tmpfs), else ``data_dir()/run`` (never a shared /tmp folder another user
    could have made first); under ``INFERSCALE_HOME``: ``run/``.

    Raises:
        PermissionError: the folder is not this user's alone (owner or mode).
    """
    home, xdg = _home(), os.environ.get("XDG_RUNTIME_DIR")
    if home is not None:
        folder = _ensure(home / "run")
    elif xdg:
        folder = _ensure(Path(xdg) / APP_NAME)
    else:
        folder = _ensure(data_dir() / "run")
    found = folder.stat()
    if found.st_uid != os.getuid() or found.st_mode & 0o077:
        raise PermissionError(
            f"{folder} must be yours alone (mode 0700): it holds the assistant's socket"
        )
    return folder


def config_dir() -> Path:
    """The folder of :func:`config_file`."""
    home = _home()
    if home is not None:
        return _ensure(home / "config")
    return _ensure(Path(platformdirs.user_config_dir(APP_NAME, appauthor=False)))


def config_file() -> Path:
    """``config.toml`` in :func:`config_dir` (the folder is created; the file may not exist)."""
    return config_dir() / CONFIG_FILENAME
