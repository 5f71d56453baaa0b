"""The one place that builds the assistant: model, KV store, encoder, engine, session.

Everything else gets its objects from here and passes them on; nothing is looked up in a
module-level registry. The pieces, in the order of the data path::

    resolve the model  ->  KV store (its folder per model fingerprint)
                       ->  engine (vLLM with our connector; in this process it shares the store)
                       ->  prompt builder (chat layout + an encoder that runs on that engine)
    fact log + embedder + extractor  ->  memory worker + session  (open_session)

One copy of the model: the engine that answers also encodes the memories.

vLLM builds the connector itself, from plain settings (the store's folder and the model's
fingerprint); :func:`start_engine` then hands the in-process connector this store object, so
both use one set of memory tiers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferscale_core import paths
from inferscale_core.config import AppConfig

if TYPE_CHECKING:  # (torch comes with the store: only when something is built)
    from inferscale_core.embedder import Embedder
    from inferscale_core.engine import Engine
    from inferscale_core.extractor import Extractor
    from inferscale_core.factlog import FactLog
    from inferscale_core.kvstore import KVStore
    from inferscale_core.memory_worker import MemoryWorker
    from inferscale_core.prompt_builder import PromptBuilder
    from inferscale_core.retrieval_thread import RetrievalThread
    from inferscale_core.retriever import Retriever
    from inferscale_core.session import Session, SessionConfig
    from inferscale_core.vllm_plugin.engine_group import EngineClient
    from inferscale_core.vllm_plugin.vllm_engine import EngineOptions

#: The steps :func:`build` reports to ``on_step``, in order (start-up progress).
STEPS = (
    "preparing the model",
    "starting the engine",
    "warming up the engine",
    "preparing the memory encoder",
)
HOST_TIER_BYTES = 1 << 30


@dataclass(slots=True)
class Assistant:
    """The built pieces: what the chat, ``ask`` and the benches use."""

    model_dir: Path
    fingerprint: str
    store: KVStore
    builder: PromptBuilder  # composes requests; encodes through the engine
    engine: Engine
    retrieval: RetrievalThread  # where every retriever made for this runtime embeds and searches


def open_store(
    model_dir: Path,
    root: Path | None = None,
    gpu_bytes: int = 0,
    store_dtype: str = "model",
    kv_cache_dtype: str = "auto",
    weights_on_load: str | None = None,
) -> KVStore:
    """The KV store of a model: ``<root>/<model fingerprint>`` (root: the data folder's kv/),
    writing entries as ``store_dtype`` (``AppConfig.store_dtype``); an engine with an fp8
    cache (``kv_cache_dtype``) or weights quantized as vLLM loads them (``weights_on_load``)
    has a store of its own (see ``model_fingerprint``)."""
    from inferscale_core.fingerprint import model_fingerprint
    from inferscale_core.kvstore import KVStore

    fingerprint = model_fingerprint(model_dir, kv_cache_dtype, weights_on_load)
    root = Path(root) if root is not None else paths.kv_dir()
    return KVStore(
        root / fingerprint,
        HOST_TIER_BYTES,
        gpu_bytes=gpu_bytes,
        fingerprint=fingerprint,
        store_dtype=store_dtype,
    )


def _engine_options(model_dir: Path, store: KVStore, **options: Any) -> EngineOptions:
    from inferscale_core.vllm_plugin.vllm_engine import EngineOptions

    connector = dict(options.pop("connector_extra", {}))
    if store.device_tier is not None:  # the connector's own store gets the same pool size
        connector.setdefault("gpu_bytes", store.device_tier.budget)
    connector.setdefault("store_dtype", store.store_dtype)  # and writes entries alike
    return EngineOptions(
        model_dir, store.root, store.fingerprint, connector_extra=connector, **options
    )


def engine_options(
    config: AppConfig, *, store_root: Path | None = None, **options: Any
) -> EngineOptions:
    """The engine's options :func:`build` would start it with (for an engine core started
    apart from the API processes that use it: ``engine_group.py``)."""
    model_dir, store, on_load = model_and_store(config, store_root)
    options.setdefault("kv_cache_dtype", config.kv_cache_dtype)
    options.setdefault("quantization", on_load)
    return _engine_options(model_dir, store, **options)


def model_and_store(
    config: AppConfig, store_root: Path | None = None, progress: bool = False
) -> tuple[Path, KVStore, str | None]:
    """The model's folder (built if a GGUF must be dequantized), its KV store and vLLM's
    on-load quantization ("fp8" or None), as ``config.weights`` plans them (weights_plan.py);
    a :class:`~inferscale_core.weights_plan.WeightsError` before anything is built."""
    from inferscale_core.model_files import model_weights, resolve_model

    on_load = model_weights(config.model, config.weights).on_load
    model_dir = resolve_model(config.model, progress=progress, weights=config.weights)
    store = open_store(
        model_dir,
        store_root,
        config.gpu_pool_bytes,
        config.store_dtype,
        config.kv_cache_dtype,
        on_load,
    )
    return model_dir, store, on_load


def start_engine(
    model_dir: Path,
    store: KVStore,
    *,
    serving: bool = False,
    engine_client: EngineClient | None = None,
    **options: Any,
) -> Engine:
    """vLLM with the connector over ``store`` (``options``: ``EngineOptions`` fields, e.g.
    ``max_model_len``, ``extra`` for more engine arguments): in this process, sharing
    ``store`` with the connector; or, ``serving``, vLLM's multi-process async engine, whose
    connector opens the same folder in the engine's processes (``engine_client``: attached to
    an engine core another process started, as one of its API processes)."""
    from inferscale_core.vllm_plugin.vllm_engine import VllmEngine

    options_ = _engine_options(model_dir, store, **options)
    if serving:
        from inferscale_core.vllm_plugin.serving_engine import ServingEngine

        return ServingEngine(options_, client=engine_client)
    engine = VllmEngine(options_)
    engine.share_store(store)
    return engine


def build(
    config: AppConfig,
    *,
    on_step: Callable[[str], None] = lambda step: None,
    store_root: Path | None = None,
    model_progress: bool = False,
    system_prompt: str | None = None,
    serving: bool = False,
    **engine_options: Any,
) -> Assistant:
    """The assistant for ``config``: its model, store, engine (warmed up) and prompt builder.
    ``on_step`` is told each of :data:`STEPS` as it starts."""
    from inferscale_core.prompt_builder import PromptBuilder, default_system_prompt
    from inferscale_core.retrieval_thread import RetrievalThread

    on_step(STEPS[0])
    model_dir, store, on_load = model_and_store(config, store_root, model_progress)
    engine_options.setdefault("kv_cache_dtype", config.kv_cache_dtype)
    engine_options.setdefault("quantization", on_load)
    on_step(STEPS[1])
    engine = start_engine(model_dir, store, serving=serving, **engine_options)
    on_step(STEPS[2])
    engine.warm_up()
    on_step(STEPS[3])
    prompt = system_prompt if system_prompt is not None else default_system_prompt()
    builder = PromptBuilder.for_model(model_dir, store, prompt, engine)
    return Assistant(model_dir, store.fingerprint, store, builder, engine, RetrievalThread())


def disk_budget(config: AppConfig, store: KVStore, factlog: FactLog) -> int | None:
    """``config.kv_disk_budget`` in bytes for ``store`` (None: off); "auto" is resolved now,
    from the free bytes of the store's file system and the bytes its model's entries take."""
    import shutil

    if config.kv_disk_budget == "off":
        return None
    held = factlog.kv_bytes(store.fingerprint) if store.fingerprint else 0
    return config.disk_budget(shutil.disk_usage(store.root).free, held)


def make_extractor(config: AppConfig, engine: Engine) -> Extractor:
    """The fact extractor ``config.extractor`` names; "auto" is the deterministic one for the
    embedded model (too small to extract reliably) and the LLM otherwise."""
    from inferscale_core.extractor import DeterministicExtractor, LLMExtractor
    from inferscale_core.model_files import is_embedded

    choice = config.extractor
    if choice == "auto":
        choice = "deterministic" if is_embedded(config.model) else "llm"
    if choice == "llm":
        return LLMExtractor(engine, engine.tokenizer)
    return DeterministicExtractor()


def session_settings(config: AppConfig, model_dir: Path) -> SessionConfig:
    """The session's settings from the user's: k, w, window, reply length, history, and the
    reply sampling of the model (``config.model`` None: the embedded one's) with the user's
    overrides."""
    from inferscale_core.generation import model_sampling
    from inferscale_core.session import SessionConfig

    sampling = model_sampling(None if config.model is None else model_dir).with_overrides(
        temperature=config.temperature,
        top_p=config.top_p,
        repetition_penalty=config.repetition_penalty,
    )
    return SessionConfig(
        k=config.k,
        w=config.w,
        window=config.window,
        max_tokens=config.max_tokens,
        history_tokens=config.history_tokens,
        recompute=config.recompute,
        sampling=sampling,
    )


def make_retriever(
    factlog: FactLog, embedder: Embedder | None = None, thread: RetrievalThread | None = None
) -> Retriever:
    """The retrieval the session runs, over ``factlog`` (``embedder``: the packaged MiniLM,
    loaded offline on first use; ``thread``: the runtime's retrieval thread, else one of its
    own). Needs no engine: ``memory search`` uses it alone."""
    from inferscale_core.embedder import SentenceTransformerEmbedder
    from inferscale_core.retriever import Retriever

    return Retriever(factlog, embedder or SentenceTransformerEmbedder(), thread=thread)


def open_session(
    assistant: Assistant,
    config: AppConfig,
    db_path: Path,
    *,
    embedder: Embedder | None = None,
    extractor: Extractor | None = None,
    session_config: SessionConfig | None = None,
    start_worker: bool = True,
) -> Session:
    """A chat session over the fact log at ``db_path``, with its background memory worker.

    ``session_config`` defaults to :func:`session_settings` of ``config``."""
    from inferscale_core.embedder import SentenceTransformerEmbedder
    from inferscale_core.factlog import FactLog
    from inferscale_core.memory_worker import MemoryWorker
    from inferscale_core.retriever import Retriever
    from inferscale_core.session import Session

    embedder = embedder or SentenceTransformerEmbedder()
    extractor = extractor or make_extractor(config, assistant.engine)
    factlog = FactLog.open(db_path)
    profile_id = factlog.profile(config.profile)
    session = Session(
        factlog,
        profile_id,
        make_retriever(factlog, embedder, assistant.retrieval),
        assistant.builder,
        assistant.store,
        assistant.engine,
        config=session_config or session_settings(config, assistant.model_dir),
    )
    session.worker = MemoryWorker(
        lambda: FactLog.open(db_path),
        profile_id,
        assistant.builder,
        assistant.store,
        extractor,
        w=session.config.w,
        window=session.config.window,
        on_change=session.notify_changed,
        make_retriever=lambda log: Retriever(log, embedder, thread=assistant.retrieval),
        wait_for_chat=assistant.engine.wait_for_chat,
        disk_budget=disk_budget(config, assistant.store, factlog),
        encode_recent_days=config.encode_recent_days,
    )
    if start_worker:
        session.worker.start()
    return session


def memory_worker(
    assistant: Assistant,
    config: AppConfig,
    db_path: Path,
    *,
    embedder: Embedder | None = None,
    poll_seconds: float = 1.0,
    encode_all: bool = False,
) -> MemoryWorker:
    """The memory worker alone (``import`` encodes in the foreground with it, no chat).
    ``encode_all``: defer no imported fact, and take those deferred at import out of waiting
    (``import --encode``: encode everything now; what the budget dropped stays dropped)."""
    from inferscale_core.embedder import SentenceTransformerEmbedder
    from inferscale_core.factlog import FactLog
    from inferscale_core.memory_worker import MemoryWorker
    from inferscale_core.retriever import Retriever

    embedder = embedder or SentenceTransformerEmbedder()
    with FactLog.open(db_path) as log:
        profile_id = log.profile(config.profile)
        if encode_all:
            log.want_kv(log.deferred_facts(profile_id, "import"))
        budget = disk_budget(config, assistant.store, log)
    return MemoryWorker(
        lambda: FactLog.open(db_path),
        profile_id,
        assistant.builder,
        assistant.store,
        make_extractor(config, assistant.engine),
        w=config.w,
        window=config.window,
        make_retriever=lambda factlog: Retriever(factlog, embedder, thread=assistant.retrieval),
        poll_seconds=poll_seconds,
        wait_for_chat=assistant.engine.wait_for_chat,
        disk_budget=budget,
        encode_recent_days=None if encode_all else config.encode_recent_days,
    )
