"""What ``inferscale-assistant models list`` shows: the models ready to run, from their files.

A row per prepared folder: the complete ones in ``cache_dir()/models`` (the embedded SmolLM2,
each dequantized GGUF) and each registered Hugging Face folder. The facts come from the build
marker (dtype, source) and ``config.json`` (model_type); nothing is loaded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from inferscale_core import model_registry
from inferscale_core.model_files import (
    MARKER,
    SMOLLM2_DIST,
    ModelSetupError,
    smollm2_gguf,
    smollm2_target,
)
from inferscale_core.paths import cache_dir

EMBEDDED_NAME = "smollm2"


@dataclass(slots=True)
class PreparedModel:
    """One row of ``models list``."""

    names: list[str]  # what --model accepts besides a path: "smollm2", registered names
    folder: Path
    size_bytes: int  # the files under the folder
    model_type: str  # config.json's, "?" if unreadable
    dtype: str  # of the saved weights, "?" if unknown
    source: str  # the GGUF, package, Ollama name or folder it came from

    def as_dict(self) -> dict:
        return {
            "names": self.names,
            "folder": str(self.folder),
            "size_bytes": self.size_bytes,
            "model_type": self.model_type,
            "dtype": self.dtype,
            "source": self.source,
        }


def prepared_models() -> list[PreparedModel]:
    """Every complete folder in ``cache_dir()/models`` and every registered model's folder;
    the embedded SmolLM2 first, then by name."""
    try:
        embedded = smollm2_target(smollm2_gguf())
    except ModelSetupError:
        embedded = None
    by_folder: dict[Path, list[model_registry.RegisteredModel]] = {}
    for entry in model_registry.load_registry().values():
        by_folder.setdefault(Path(entry.folder), []).append(entry)
    models = cache_dir() / "models"
    found = models.iterdir() if models.is_dir() else ()
    folders = sorted(f for f in found if f.is_dir() and (f / MARKER).is_file())
    folders += [f for f in by_folder if f not in folders and f.is_dir()]
    rows = [_row(folder, by_folder.get(folder, []), folder == embedded) for folder in folders]
    rows.sort(key=lambda r: (not r.names or r.names[0] != EMBEDDED_NAME, r.names, r.folder.name))
    return rows


def _row(folder: Path, entries: list[model_registry.RegisteredModel], embedded: bool):
    marker = _read_json(folder / MARKER)
    config = _read_json(folder / "config.json")
    names = sorted(e.name for e in entries)
    source = ", ".join(sorted({e.origin for e in entries})) or str(marker.get("source", "?"))
    if embedded:
        names.insert(0, EMBEDDED_NAME)
        source = f"{marker.get('source_package', SMOLLM2_DIST)} (embedded)"
    dtype = marker.get("dtype") or config.get("dtype") or config.get("torch_dtype") or "?"
    return PreparedModel(
        names=names,
        folder=folder,
        size_bytes=sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()),
        model_type=str(config.get("model_type", "?")),
        dtype=str(dtype),
        source=source,
    )


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
