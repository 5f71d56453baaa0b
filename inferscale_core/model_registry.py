"""The user's own models, registered under short names (``inferscale-assistant models add``).

One small JSON file, ``config_dir()/models.json`` (mode 0600, replaced atomically), maps a
short name to where the model comes from::

    {"models": {"llama3.2-1b": {"source": "/home/me/.ollama/models/blobs/sha256-74701a…",
                                "label": "llama3.2-1b", "origin": "ollama llama3.2:1b",
                                "folder": "/home/me/.cache/inferscale-assistant/models/…",
                                "added": "2026-12-02T10:00:00+00:00"}}}

``source`` is a GGUF file or a Hugging Face folder; ``folder`` is the prepared Hugging Face
folder (the dequantized cache folder of a GGUF, or ``source`` itself); ``label`` names the
cache folder (``<label>-<hash>``); ``origin`` says where the user got it, for ``models list``.
Imports nothing from the project but :mod:`inferscale_core.files` and
:mod:`inferscale_core.paths`.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from inferscale_core.files import write_atomic
from inferscale_core.paths import config_dir

REGISTRY_FILENAME = "models.json"
#: A short name: letters, digits and ``. _ : -``, starting with a letter or digit.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")


class RegistryError(ValueError):
    """The registry file cannot be read, or a name is not allowed; the message says why."""


@dataclass(slots=True)
class RegisteredModel:
    name: str
    source: str  # the GGUF file or Hugging Face folder it was added from
    folder: str  # the prepared Hugging Face folder
    label: str  # the cache folder's name without its hash
    origin: str  # what the user gave, e.g. "ollama llama3.2:1b" or the path
    added: str  # ISO 8601 time of `models add`


def registry_file() -> Path:
    """``models.json`` in :func:`~inferscale_core.paths.config_dir` (may not exist yet)."""
    return config_dir() / REGISTRY_FILENAME


def check_name(name: str) -> str:
    """``name`` if it can be a registered name, else :class:`RegistryError`."""
    if not NAME_PATTERN.fullmatch(name):
        raise RegistryError(
            f"{name!r} cannot be a model name: use up to 64 letters, digits, '.', '_', ':' or"
            " '-', starting with a letter or digit"
        )
    return name


def load_registry(path: Path | None = None) -> dict[str, RegisteredModel]:
    """The registered models by name; empty when the file does not exist."""
    path = path or registry_file()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise RegistryError(f"{path} cannot be read ({exc}); fix or delete it") from exc
    try:
        return {name: RegisteredModel(name=name, **entry) for name, entry in data["models"].items()}
    except (KeyError, TypeError, AttributeError) as exc:
        raise RegistryError(f"{path} is not a model registry ({exc!r}); fix or delete it") from exc


def _save(models: dict[str, RegisteredModel], path: Path) -> None:
    entries = {name: asdict(m) for name, m in sorted(models.items())}
    for entry in entries.values():
        del entry["name"]
    write_atomic(path, json.dumps({"models": entries}, indent=2) + "\n")


def register(model: RegisteredModel, path: Path | None = None) -> None:
    """Add ``model`` (replacing an entry of the same name)."""
    path = path or registry_file()
    models = load_registry(path)
    models[check_name(model.name)] = model
    _save(models, path)


def unregister(name: str, path: Path | None = None) -> RegisteredModel | None:
    """Drop ``name``; the entry it had, or None when it was not registered."""
    path = path or registry_file()
    models = load_registry(path)
    gone = models.pop(name, None)
    if gone is not None:
        _save(models, path)
    return gone
