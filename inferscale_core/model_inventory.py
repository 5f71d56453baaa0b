"""What ``inferscale-assistant models list`` shows: the models ready to run, from their files.

A row per prepared folder: the complete ones in ``cache_dir()/models`` (the embedded SmolLM2,
each dequantized GGUF) and each registered Hugging Face folder. The facts come from the build
marker (dtype, source) and ``config.json`` (model_type), the quantization from the GGUF's
header or the folder's ``quantization_config`` (:mod:`inferscale_core.weights_plan`); nothing
is loaded.
"""

from __future__ import annotations

import contextlib
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
    quantization: str = "?"  # as stored: "Q4_1", "Q4_K_M" (a GGUF's), "awq", "bfloat16"
    note: str = ""  # how the engine serves it, where not as stored ("dequantized: ...")

    def as_dict(self) -> dict:
        return {
            "names": self.names,
            "folder": str(self.folder),
            "size_bytes": self.size_bytes,
            "model_type": self.model_type,
            "dtype": self.dtype,
            "source": self.source,
            "quantization": self.quantization,
            "note": self.note,
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
    from inferscale_core.weights_plan import engine_device

    device = engine_device()
    rows = [
        _row(folder, by_folder.get(folder, []), folder == embedded, device) for folder in folders
    ]
    rows.sort(key=lambda r: (not r.names or r.names[0] != EMBEDDED_NAME, r.names, r.folder.name))
    return rows


def _row(
    folder: Path, entries: list[model_registry.RegisteredModel], embedded: bool, device: str
) -> PreparedModel:
    marker = _read_json(folder / MARKER)
    config = _read_json(folder / "config.json")
    names = sorted(e.name for e in entries)
    source = ", ".join(sorted({e.origin for e in entries})) or str(marker.get("source", "?"))
    if embedded:
        names.insert(0, EMBEDDED_NAME)
        source = f"{marker.get('source_package', SMOLLM2_DIST)} (embedded)"
    dtype = marker.get("dtype") or config.get("dtype") or config.get("torch_dtype") or "?"
    quantization, note = _quantization(folder, marker, device)
    return PreparedModel(
        names=names,
        folder=folder,
        size_bytes=sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()),
        model_type=str(config.get("model_type", "?")),
        dtype=str(dtype),
        source=source,
        quantization=quantization,
        note=note,
    )


def _quantization(folder: Path, marker: dict, device: str) -> tuple[str, str]:
    """A folder's quantization as stored and the plan's note (a dequantized GGUF: the GGUF's
    file type, from the marker or, for folders built before it was recorded, the file)."""
    from inferscale_core.weights_plan import (
        INT4_SERVED,
        NO_GGUF_LOADER,
        WeightsError,
        folder_quantization,
        inspect_gguf,
    )

    if "source_size" not in marker:  # not built from a GGUF: the folder says
        return folder_quantization(folder), ""
    quantization = marker.get("quantization")
    source = Path(str(marker.get("source", "")))
    if quantization is None and source.is_file():
        with contextlib.suppress(WeightsError):
            quantization = inspect_gguf(source).file_type
    if "int4" in marker:  # the GGUF's 4-bit codes (gguf_int4.py)
        served = INT4_SERVED.format(quantization or "?")
        return str(quantization or "?"), f"{served}: {NO_GGUF_LOADER[device]}"
    return str(quantization or "?"), f"dequantized: {NO_GGUF_LOADER[device]}"


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
