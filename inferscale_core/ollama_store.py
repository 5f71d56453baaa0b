"""Models the user already pulled with Ollama, found in its local store (read only, offline).

Ollama keeps every model as content-addressed blobs under its store root: ``$OLLAMA_MODELS``,
else ``~/.ollama/models``. A name ``llama3.2:1b`` has the manifest
``manifests/registry.ollama.ai/library/llama3.2/1b`` (the tag defaults to ``latest``; a name
``ns/model`` is ``manifests/registry.ollama.ai/ns/model/<tag>``, and ``host/ns/model`` is
``manifests/host/ns/model/<tag>``). The manifest is JSON; the entry of its ``layers`` whose
``mediaType`` is ``application/vnd.ollama.image.model`` has ``digest`` ``sha256:<hex>``, and the
weights are the blob ``blobs/sha256-<hex>``: a GGUF file, which
:func:`inferscale_core.model_files.resolve_model` dequantizes like any other.

Nothing here runs or contacts Ollama.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from inferscale_core.model_files import ModelSetupError, is_gguf

OLLAMA_MODELS_ENV = "OLLAMA_MODELS"
DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"
MODEL_MEDIA_TYPE = "application/vnd.ollama.image.model"
_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(:[0-9]+)?")


@dataclass(frozen=True, slots=True)
class OllamaModel:
    name: str  # as given, with its tag: "llama3.2:1b", "qwen3:latest"
    manifest: Path
    blob: Path  # the GGUF weights


def ollama_root() -> Path:
    """The store root: ``$OLLAMA_MODELS``, else ``~/.ollama/models``."""
    configured = os.environ.get(OLLAMA_MODELS_ENV)
    return Path(configured).expanduser() if configured else Path.home() / ".ollama" / "models"


def looks_like_ollama_name(text: str) -> bool:
    """Whether ``text`` has the shape of an Ollama model name (``[host/][ns/]model[:tag]``)."""
    try:
        _manifest_parts(text)
    except ValueError:
        return False
    return True


def _manifest_parts(name: str) -> tuple[str, str, str, str]:
    """``(host, namespace, model, tag)``; ValueError if ``name`` is not an Ollama name."""
    path, tag = name, DEFAULT_TAG
    if ":" in name.rsplit("/", 1)[-1]:  # a tag, not a host's port
        path, _, tag = name.rpartition(":")
    parts = path.split("/")
    if len(parts) == 1:
        parts = [DEFAULT_HOST, DEFAULT_NAMESPACE, *parts]
    elif len(parts) == 2:
        parts = [DEFAULT_HOST, *parts]
    if len(parts) != 3 or not _HOST.fullmatch(parts[0]):
        raise ValueError(name)
    if not all(_PART.fullmatch(p) for p in (*parts[1:], tag)):
        raise ValueError(name)
    host, namespace, model = parts
    return host, namespace, model, tag


def find_ollama_model(name: str, root: Path | None = None) -> OllamaModel:
    """The GGUF blob of the Ollama model ``name`` in the store at ``root`` (default
    :func:`ollama_root`); :class:`ModelSetupError` (one line) if the store, the model or its
    weights are missing, or the weights are not a GGUF file."""
    root = root or ollama_root()
    try:
        host, namespace, model, tag = _manifest_parts(name)
    except ValueError:
        raise ModelSetupError(
            f"{name!r} is neither an existing file or folder nor an Ollama model name"
            " ([host/][namespace/]model[:tag], e.g. llama3.2:1b)"
        ) from None
    if not (root / "manifests").is_dir():
        raise ModelSetupError(
            f"there is no Ollama model store at {root} (set {OLLAMA_MODELS_ENV} to the folder"
            f" holding manifests/ and blobs/), so {name!r} cannot be found; give a .gguf file or"
            " a Hugging Face folder instead"
        )
    manifest = root / "manifests" / host / namespace / model / tag
    full = name if name.endswith(f":{tag}") else f"{name}:{tag}"
    if not manifest.is_file():
        raise ModelSetupError(
            f"{full} is not in the Ollama store at {root} (no {manifest.relative_to(root)});"
            " `ollama list` shows what it holds"
        )
    try:
        layers = json.loads(manifest.read_text(encoding="utf-8"))["layers"]
        digest = next(
            layer["digest"] for layer in layers if layer.get("mediaType") == MODEL_MEDIA_TYPE
        )
    except StopIteration:
        raise ModelSetupError(f"the Ollama manifest {manifest} has no model layer") from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ModelSetupError(f"the Ollama manifest {manifest} cannot be read: {exc!r}") from exc
    algorithm, _, hex_digest = str(digest).partition(":")
    if algorithm != "sha256" or not re.fullmatch(r"[0-9a-f]{64}", hex_digest):
        raise ModelSetupError(f"the Ollama manifest {manifest} has an odd digest {digest!r}")
    blob = root / "blobs" / f"sha256-{hex_digest}"
    if not blob.is_file():
        raise ModelSetupError(f"{full}: its weights {blob} are missing from the Ollama store")
    if not is_gguf(blob):
        raise ModelSetupError(f"{full}: its weights {blob} are not a GGUF file")
    return OllamaModel(name=full, manifest=manifest, blob=blob)
