"""How a model's weights reach the engine: as stored, dequantized, or quantized on load.

One decision, :func:`weights_plan`, from the model's files, the engine's device and the
``weights`` setting (``auto | as-stored | fp8``):

* **A GGUF file** is checked first (:func:`inspect_gguf`: every tensor lies inside the file and
  is of a type that can be dequantized) and then dequantized into a Hugging Face folder, on
  both engines: neither vLLM the assistant runs on has a GGUF loader (checked in the wheels:
  vLLM 0.32, the CPU engine, and vLLM 0.26, the CUDA one, list no ``"gguf"`` quantization and
  ship no ``gguf_loader``; ``tests/unit/test_weights_support.py`` pins it for the
  installed one). ``weights = as-stored`` refuses it for that reason. With ``auto``, a Llama
  GGUF whose 4-bit tensors are all Q4_0 becomes a 4-bit folder instead
  (:mod:`inferscale_core.gguf_int4`: its own codes and scales as compressed-tensors W4A16; both
  engines run it, the CPU one only with AVX-512, ``cpu_features.int4_weights``; without, it
  is dequantized and the note says why); Q4_1 and Q4_K are dequantized, as their float
  offsets would be rounded.
* **A Hugging Face folder** with a ``quantization_config`` (AWQ, GPTQ, compressed-tensors,
  fp8: :data:`HF_QUANT_METHODS`) is passed to vLLM as it is, which serves it with its own
  kernels; another ``quant_method`` is refused at once, and so is a 4-bit compressed-tensors
  folder (``pack-quantized``) on a CPU without AVX-512.
* **``weights = fp8``** quantizes an unquantized model (a bf16/float32 folder, a dequantized
  GGUF) to fp8 as vLLM loads it (``quantization="fp8"``), on CUDA only.

A refusal is a one-line :class:`WeightsError` (a ``ModelSetupError``: exit 2 in the CLI). No
vLLM import here: what the engines can do is written down, and the engine test checks it.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from inferscale_core.config import WEIGHTS_SETTINGS
from inferscale_core.model_basics import ModelSetupError, is_gguf

#: ``quant_method`` values of a ``quantization_config`` that vLLM serves as stored (CUDA).
HF_QUANT_METHODS = frozenset({"awq", "gptq", "compressed-tensors", "fp8"})
#: Why a GGUF is dequantized on each engine (the engines' vLLM has no GGUF loader).
NO_GGUF_LOADER = {
    "cpu": "the CPU engine (vLLM 0.32) has no GGUF loader",
    "cuda": "the CUDA engine (vLLM 0.26) has no GGUF loader",
}
#: GGUF 4-bit types whose float offsets a W4A16 folder's integer zero point would round.
INT4_ROUNDED = frozenset({"Q4_1", "Q4_K"})
#: How a 4-bit folder made from a GGUF is served (``served`` and the note's start).
INT4_SERVED = "4-bit (from {}, compressed-tensors W4A16)"
NO_CPU_INT4 = "vLLM's CPU 4-bit kernel is built for AVX-512 only, which this CPU lacks"
#: GGUF tensor types stored unquantized (their name is the dtype).
_FLOAT_TYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


class WeightsError(ModelSetupError):
    """Weights that cannot be served as asked; the one-line message says why and what to do."""


@dataclass(frozen=True, slots=True)
class GGUFInfo:
    """What a GGUF file holds, from its header (nothing is dequantized)."""

    file_type: str  # llama.cpp's name of the file's quantization: "Q4_1", "Q4_K_M", "F16"
    tensor_types: dict[str, int]  # type name -> tensors of that type
    weights_bytes: int  # the tensors' bytes as stored
    architecture: str = ""  # general.architecture: "llama"

    @property
    def int4_exact(self) -> bool:
        """Its 4-bit tensors map exactly onto a compressed-tensors W4A16 folder: all Q4_0."""
        types = set(self.tensor_types)
        return self.architecture == "llama" and "Q4_0" in types and not types & INT4_ROUNDED


@dataclass(frozen=True, slots=True)
class WeightsPlan:
    """How one model's weights are served (see the module docstring)."""

    quantization: str  # as stored: "Q4_1", "Q4_K_M", "awq", "fp8", "bfloat16", "float32"
    dequantize: bool  # a GGUF turned into a Hugging Face folder first
    on_load: str | None  # vLLM's ``quantization=`` (quantized as it loads), else None
    note: str  # one line for ``doctor`` and ``models list``; "" when served as stored
    int4: bool = False  # a GGUF's 4-bit codes repacked into a W4A16 folder (gguf_int4.py)

    @property
    def served(self) -> str:
        """What the engine runs, in a few words."""
        if self.int4:
            return INT4_SERVED.format(self.quantization)
        if self.on_load:
            return f"{self.on_load} (quantized on load)"
        return "dequantized" if self.dequantize else self.quantization


def inspect_gguf(path: Path) -> GGUFInfo:
    """The header facts of the GGUF ``path`` (:mod:`inferscale_core.gguf_header`: fast, no
    tensor read); :class:`WeightsError` for a file that is cut short or holds a tensor type
    that cannot be dequantized."""
    import gguf
    from gguf.quants import _type_traits

    from inferscale_core.gguf_header import GGUFHeaderError, read_header

    try:
        header = read_header(path)
    except (GGUFHeaderError, OSError) as exc:
        raise WeightsError(
            f"{path} cannot be read as a GGUF file: it is cut short or damaged ({_one_line(exc)})"
        ) from exc
    known = {t.value: t.name for t in gguf.GGMLQuantizationType}
    types: Counter[str] = Counter()
    stored = 0
    for tensor in header.tensors:
        name = known.get(tensor.type_id, f"#{tensor.type_id}")
        types[name] += 1
        if name not in known.values():
            continue
        block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]]
        n_bytes = math.prod(tensor.shape) // block * type_size
        end = tensor.offset + n_bytes
        if end > header.size:
            raise WeightsError(
                f"{path} is cut short: tensor {tensor.name} ends at byte {end:,} of a"
                f" {header.size:,}-byte file (an interrupted download or copy?)"
            )
        stored += n_bytes
    readable = set(_FLOAT_TYPES) | {t.name for t in _type_traits}
    unknown = sorted(set(types) - readable)
    if unknown:
        raise WeightsError(
            f"{path} holds tensors of type {', '.join(unknown)}, which the GGUF dequantizer"
            f" cannot read (readable: {', '.join(sorted(readable))})"
        )
    file_type = _file_type(header.metadata.get("general.file_type"), types)
    arch = header.metadata.get("general.architecture")
    return GGUFInfo(file_type, dict(types), stored, arch if isinstance(arch, str) else "")


def _file_type(file_type: object, types: Counter[str]) -> str:
    """llama.cpp's name of ``general.file_type``, else the quantized type with most tensors."""
    import gguf

    if isinstance(file_type, int):
        try:
            return gguf.LlamaFileType(file_type).name.removeprefix("MOSTLY_")
        except ValueError:
            pass
    quantized = [t for t in types if t not in _FLOAT_TYPES]
    return max(quantized or types or ["?"], key=lambda t: types.get(t, 0))


def folder_quantization(folder: Path) -> str:
    """A Hugging Face folder's ``quant_method``, else its weights' dtype ("?" if unknown)."""
    config = _config(folder)
    quant = config.get("quantization_config")
    if isinstance(quant, dict):
        return str(quant.get("quant_method", "?"))
    return str(config.get("dtype") or config.get("torch_dtype") or "?")


def weights_plan(
    source: Path, device: str, setting: str = "auto", cpu_int4: bool | None = None
) -> WeightsPlan:
    """How ``source`` (a GGUF file or a Hugging Face folder) is served on ``device``
    ("cpu" | "cuda") with the ``weights`` setting; :class:`WeightsError` when it cannot be.
    ``cpu_int4``: whether the CPU engine runs 4-bit weights (default: this CPU,
    :func:`~inferscale_core.cpu_features.int4_weights`)."""
    if setting not in WEIGHTS_SETTINGS:
        raise WeightsError(f"weights must be one of {', '.join(WEIGHTS_SETTINGS)}; got {setting!r}")
    source = Path(source)
    if source.is_file() and is_gguf(source):
        info = inspect_gguf(source)
        why = NO_GGUF_LOADER[device]
        if setting == "as-stored":
            raise WeightsError(
                f"weights = as-stored cannot serve {source.name} ({info.file_type}): {why};"
                " set weights = auto to run it dequantized"
            )
        if setting == "auto" and info.int4_exact:
            if _runs_int4(device, cpu_int4):
                served = INT4_SERVED.format(info.file_type)
                return WeightsPlan(info.file_type, False, None, f"{served}: {why}", int4=True)
            why = f"{why}; {NO_CPU_INT4}"  # a Q4_0 the CPU cannot run as 4 bits
        return _on_load(source.name, info.file_type, True, f"dequantized: {why}", device, setting)
    quantization = folder_quantization(source)
    quant = _config(source).get("quantization_config")
    if isinstance(quant, dict):
        if quantization not in HF_QUANT_METHODS:
            raise WeightsError(
                f"{source} is quantized with {quantization!r}, which the assistant does not"
                f" serve (served as stored on a GPU: {', '.join(sorted(HF_QUANT_METHODS))})"
            )
        if setting == "fp8":
            raise WeightsError(
                f"weights = fp8 cannot requantize {source.name}: it is {quantization} already;"
                " set weights = auto"
            )
        if "pack-quantized" in json.dumps(quant) and not _runs_int4(device, cpu_int4):
            raise WeightsError(
                f"{source.name} holds 4-bit weights (compressed-tensors W4A16), which the CPU"
                f" engine cannot run here: {NO_CPU_INT4}; use its float or GGUF form"
            )
        return WeightsPlan(quantization, False, None, "")
    return _on_load(source.name, quantization, False, "", device, setting)


def _runs_int4(device: str, cpu_int4: bool | None) -> bool:
    """Whether the engine on ``device`` runs 4-bit weights: CUDA does, the CPU where
    ``cpu_int4`` says so (default: this CPU, :func:`~inferscale_core.cpu_features.int4_weights`;
    torch is imported only then)."""
    if device != "cpu":
        return True
    if cpu_int4 is None:
        from inferscale_core.cpu_features import int4_weights

        return int4_weights()
    return cpu_int4


def _on_load(
    name: str, quantization: str, dequantize: bool, note: str, device: str, setting: str
) -> WeightsPlan:
    """The plan of unquantized (or dequantized) weights, fp8 on load where asked."""
    if setting != "fp8":
        return WeightsPlan(quantization, dequantize, None, note)
    if device != "cuda":
        raise WeightsError(
            f"weights = fp8 needs a GPU: the CPU engine has no fp8 weight kernels, so {name}"
            " cannot be quantized on load here; set weights = auto"
        )
    note = "; ".join(filter(None, (note, "quantized to fp8 as vLLM loads it")))
    return WeightsPlan(quantization, dequantize, "fp8", note)


def engine_device() -> str:
    """ "cuda" where torch sees a GPU (vLLM's CUDA engine runs there), else "cpu"."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _config(folder: Path) -> dict:
    try:
        data = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
