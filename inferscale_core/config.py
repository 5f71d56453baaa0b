"""The user's settings: one TOML file (``paths.config_file()``), read by the CLI and the TUI.

Imports nothing from the project but the leaves :mod:`inferscale_core.files`,
:mod:`inferscale_core.context_window` and :mod:`inferscale_core.generation`. A missing file
means the defaults; a bad value is a :class:`ConfigError` that names the file, the key and what
is allowed, so the user can fix it by hand. :func:`save` writes atomically (temporary file,
fsync, rename), mode 0600.

Example file::

    model = "/models/Llama-3.1-8B-Instruct"   # or a .gguf file, or a name from `models list`;
                                              # leave out for the embedded SmolLM2
    k = 50              # facts retrieved per reply
    w = 20              # context turns each fact is encoded with
    window = "anchored" # anchored | sliding: which turns (see context_window.py)
    gpu_pool_gib = 0    # device tier of the KV store (0: none)
    profile = "default"
    inbox = "~/Downloads/chats"  # exports dropped here are imported; leave out for data/inbox
    extractor = "auto"  # auto | deterministic | llm
    temperature = 0.2   # reply sampling; leave out for the model's own default
    top_p = 0.9         # (likewise)
    repetition_penalty = 1.1  # (likewise; 1 = none)
    max_tokens = 512    # reply length limit, in tokens
    history_tokens = 1024  # recent turns kept in the prompt, in tokens
    recompute = 4       # the best hits prefilled with the question, not injected
    kv_store_dtype = "auto"  # auto | model | fp8 | int4: how memories' KV is kept (auto: int4;
                             # model with kv_cache_dtype = "fp8")
    kv_cache_dtype = "auto"  # auto | fp8: the engine's KV cache (fp8: half of bf16, for more
                             # users and longer prompts; a GPU, or a CPU with AVX-512 or AMX)
    kv_disk_budget = "auto"  # auto | off | a size ("20 GB", "1.5GiB", bytes): the most the KV
                             # store keeps; the least recently injected KV is dropped past it
                             # (auto: 25% of the free disk plus what the store holds, at start)
    kv_encode_recent_days = 30  # imported turns older than this before their conversation's
                                # last are encoded when first retrieved; "all": encode all
    weights = "auto"    # auto | as-stored | fp8: how the model's weights are served (fp8:
                        # quantized as vLLM loads them, half of bf16; a GPU only)
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from inferscale_core.context_window import ANCHORED, WINDOWS
from inferscale_core.generation import GREEDY

EXTRACTORS = ("auto", "deterministic", "llm")
KV_STORE_DTYPES = ("auto", "model", "fp8", "int4")  # kvstore.quant.SCHEMES and "auto"
KV_CACHE_DTYPES = ("auto", "fp8")  # vLLM's kv_cache_dtype: the model's dtype, or fp8 e4m3
WEIGHTS_SETTINGS = ("auto", "as-stored", "fp8")  # inferscale_core/weights_plan.py
# What "auto" stores, per engine (docs/BENCHMARKS.md, "Compressed memory"). CPU: int4 is 6.7x
# smaller than fp32 at 0.004 nats of KL and injects no slower (cold 2.5x faster). CUDA (H200,
# 8B shape): 3.5x smaller than bf16, 100 users at k=50 at 0.96x bf16's rate, k=50 from the pool
# 1.05x, cold from disk 2.7x faster; so the pool and host RAM hold 3.5x more facts.
AUTO_STORE_DTYPE = {"cpu": "int4", "cuda": "int4"}
# kv_disk_budget = "auto": this share of (the free bytes on the store's file system + the bytes
# the store holds), resolved when the assistant starts.
AUTO_DISK_SHARE = 0.25
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?|\.\d+)\s*([kmgt]i?b|b)?\s*", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_UNITS |= {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_size(value: str | int) -> int:
    """Bytes of a size as the settings write it: a whole number of bytes, or a number and a
    unit, ``"20 GB"``, ``"500MB"``, ``"1.5GiB"`` (kB/MB/GB/TB are powers of 1000, KiB/MiB/
    GiB/TiB of 1024). Raises :class:`ConfigError` for anything else or a size of 0."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ConfigError(f"a size must be text like '20 GB' or a number of bytes, got {value!r}")
    found = None if isinstance(value, int) else _SIZE.fullmatch(value)
    if isinstance(value, int):
        size = value
    elif found is None:
        raise ConfigError(
            f"{value!r} is not a size: write a number and a unit (B, kB, MB, GB, TB, KiB, MiB,"
            f" GiB, TiB), e.g. '20 GB' or '1.5GiB', or a number of bytes"
        )
    else:
        size = int(float(found.group(1)) * _UNITS[(found.group(2) or "b").lower()])
    if size <= 0:
        raise ConfigError(f"a size must be more than 0 bytes, got {value!r}")
    return size


class ConfigError(ValueError):
    """The config file (or a value given for it) is not valid; the message says how to fix it."""


@dataclass(slots=True)
class AppConfig:
    model: str | None = None  # HF folder, .gguf file or `models add` name; None = SmolLM2
    # Facts retrieved per reply. 50 from the curve (docs/BENCHMARKS.md, "Choosing k"): evidence
    # recall 0.83 at k=10 -> 0.93 at 50; LoCoMo F1 with the facts as text 0.082 -> 0.106, flat
    # by 100; injected (r=4) it holds 0.94x of that, for +2.6 ms TTFT on the H200 (8B shape).
    k: int = 50
    w: int = 20  # context turns each fact is encoded with
    window: str = ANCHORED  # which turns: anchored | sliding (inferscale_core.context_window)
    gpu_pool_gib: float = 0  # size of the KV store's device tier; 0 = no device tier
    profile: str = "default"  # whose memory (one fact log holds several profiles)
    inbox: str | None = None  # folder watched for exports; None = paths.inbox_dir() (data dir)
    extractor: str = "auto"  # auto: deterministic for the embedded model, the LLM otherwise
    temperature: float | None = None  # reply sampling; None: the model's own (generation.py)
    top_p: float | None = None
    repetition_penalty: float | None = None
    max_tokens: int = 512  # reply length limit
    history_tokens: int = 1024  # recent turns kept in the prompt, at most this many tokens
    # The best hits prefilled with the question (after the injected ones), not injected: at
    # k=20 on LoCoMo, r=4 cuts next-token KL against prompt injection by 56% for 1.22x TTFT.
    recompute: int = 4
    # How each memory's KV entry is stored (inferscale_core/kvstore/quant.py): "model" keeps
    # the model's dtype (exact), "fp8" is ~4x smaller than fp32 / 2x than bf16, "int4" ~7x /
    # 3.5x. "auto": int4 on both engines today (AUTO_STORE_DTYPE).
    kv_store_dtype: str = "auto"
    # vLLM's KV cache: "auto" holds K and V in the model's dtype, "fp8" in fp8 e4m3 (vLLM's own
    # kv_cache_dtype; the engine's cache holds twice the tokens of bf16). Entries are then kept
    # as that cache holds them, so kv_store_dtype "auto" means "model" there (already 1 byte
    # an element, and exact: an entry at its own position is the engine's own bytes).
    kv_cache_dtype: str = "auto"
    # The most the KV store keeps on disk (per model): past it the memory worker drops the KV of
    # the least recently injected facts (the facts stay; they go in as text and are encoded
    # again when retrieved). "auto": AUTO_DISK_SHARE of the free disk plus what the store
    # holds, resolved at start; "off": no limit; or a size (parse_size).
    kv_disk_budget: str | int = "auto"
    # Facts from imported turns older than this many days before the last turn of their
    # conversation are encoded when first retrieved, not at import ("all": every one now).
    kv_encode_recent_days: int | str = 30
    # How the model's weights are served (inferscale_core/weights_plan.py): "auto" as stored
    # where the engine can (a GGUF is dequantized: neither engine's vLLM has a GGUF loader),
    # "as-stored" refuses a model it would have to dequantize, "fp8" quantizes an unquantized
    # model to fp8 as vLLM loads it (CUDA only; half of bf16's GPU memory).
    weights: str = "auto"

    def __post_init__(self) -> None:
        if self.model is not None and (not isinstance(self.model, str) or not self.model.strip()):
            raise ConfigError(
                f"model must be a model folder, a .gguf file or an added model's name (text), or"
                f" left out for the embedded SmolLM2;"
                f" got {self.model!r}"
            )
        for name in ("k", "w", "recompute"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"{name} must be a whole number >= 0, got {value!r}")
        gib = self.gpu_pool_gib
        if isinstance(gib, bool) or not isinstance(gib, int | float) or gib < 0 or gib != gib:
            raise ConfigError(f"gpu_pool_gib must be a number of GiB >= 0, got {gib!r}")
        if not isinstance(self.profile, str) or not self.profile.strip():
            raise ConfigError(f"profile must be a non-empty name, got {self.profile!r}")
        if self.inbox is not None:
            self._check_inbox()
        if self.window not in WINDOWS:
            raise ConfigError(f"window must be one of {', '.join(WINDOWS)}; got {self.window!r}")
        for name in ("max_tokens", "history_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a whole number >= 1, got {value!r}")
        sampling = {n: getattr(self, n) for n in ("temperature", "top_p", "repetition_penalty")}
        for name, value in sampling.items():
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float)
            ):
                raise ConfigError(f"{name} must be a number, got {value!r}")
        try:
            GREEDY.with_overrides(**sampling)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if self.kv_store_dtype not in KV_STORE_DTYPES:
            raise ConfigError(
                f"kv_store_dtype must be one of {', '.join(KV_STORE_DTYPES)};"
                f" got {self.kv_store_dtype!r}"
            )
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError(
                f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)};"
                f" got {self.kv_cache_dtype!r}"
            )
        if self.weights not in WEIGHTS_SETTINGS:
            raise ConfigError(
                f"weights must be one of {', '.join(WEIGHTS_SETTINGS)}; got {self.weights!r}"
            )
        if self.kv_disk_budget not in ("auto", "off"):
            try:
                parse_size(self.kv_disk_budget)
            except ConfigError as exc:
                raise ConfigError(f"kv_disk_budget must be auto, off or a size; {exc}") from None
        days = self.kv_encode_recent_days
        if days != "all" and (isinstance(days, bool) or not isinstance(days, int) or days < 0):
            raise ConfigError(
                f"kv_encode_recent_days must be a whole number of days >= 0 or all, got {days!r}"
            )
        if self.extractor not in EXTRACTORS:
            raise ConfigError(
                f"extractor must be one of {', '.join(EXTRACTORS)}; got {self.extractor!r}"
            )

    def _check_inbox(self) -> None:
        """A folder path, absolute or ``~/…``, not a file (it is created 0700 when watched)."""
        inbox = self.inbox
        if not isinstance(inbox, str) or not inbox.strip():
            raise ConfigError(
                f"inbox must be a folder path, or left out for the inbox in the data folder;"
                f" got {inbox!r}"
            )
        path = Path(inbox).expanduser()
        if not path.is_absolute():
            raise ConfigError(f"inbox must be an absolute path (or start with ~/); got {inbox!r}")
        if path.exists() and not path.is_dir():
            raise ConfigError(f"inbox must be a folder, but {inbox!r} is a file")

    @property
    def gpu_pool_bytes(self) -> int:
        return int(self.gpu_pool_gib * (1 << 30))

    @property
    def store_dtype(self) -> str:
        """``kv_store_dtype`` with "auto" resolved for the engine of this machine (CUDA when
        torch sees a GPU; with an fp8 cache, "model": see ``kv_cache_dtype``)."""
        if self.kv_store_dtype != "auto":
            return self.kv_store_dtype
        if self.kv_cache_dtype == "fp8":
            return "model"
        import torch

        return AUTO_STORE_DTYPE["cuda" if torch.cuda.is_available() else "cpu"]

    def disk_budget(self, free_bytes: int, held_bytes: int) -> int | None:
        """``kv_disk_budget`` in bytes (None: off), "auto" resolved for a store holding
        ``held_bytes`` on a file system with ``free_bytes`` free."""
        if self.kv_disk_budget == "off":
            return None
        if self.kv_disk_budget == "auto":
            return int(AUTO_DISK_SHARE * (free_bytes + held_bytes))
        return parse_size(self.kv_disk_budget)

    @property
    def encode_recent_days(self) -> int | None:
        """``kv_encode_recent_days`` as the memory worker takes it (None: "all")."""
        days = self.kv_encode_recent_days
        return None if days == "all" else int(days)

    def to_dict(self) -> dict[str, Any]:
        """The TOML table: every key, except those left to a default (None: TOML has no null)."""
        return {key: value for key, value in asdict(self).items() if value is not None}


KEYS = tuple(f.name for f in fields(AppConfig))


def load(path: Path | str) -> AppConfig:
    """The settings in ``path``; the defaults when it does not exist.

    Raises :class:`ConfigError` for a file that is not TOML, an unknown key or a bad value.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return AppConfig()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the config file {path}: {exc}") from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML ({exc}); fix or delete it") from exc
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise ConfigError(
            f"{path}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(KEYS)}"
        )
    try:
        return AppConfig(**data)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def save(config: AppConfig, path: Path | str) -> Path:
    """Write ``config`` to ``path`` atomically (a reader sees the old file or the new one)."""
    import tomli_w

    from inferscale_core.files import write_atomic  # a leaf module: no import cycle

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    body = "# InferScale assistant settings (inferscale-assistant, Settings screen)\n"
    body += tomli_w.dumps(config.to_dict())
    return write_atomic(path, body)
