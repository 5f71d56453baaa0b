"""``bench retrieval``: embed + top-k search time at 10k and 100k facts, exact vs CAGRA.

Per corpus size N and index kind (:class:`~inferscale_core.vector_index.ExactIndex` on the
device; :class:`~inferscale_core.vector_index.CagraIndex` where cuVS and a CUDA device are,
else reported as skipped with the index's own reason):

* build: ``add`` of the first N - m vectors to an empty index (CAGRA builds its graph here);
* extend: ``add`` of the last m = min(1,000, N/10) to the built index (``cagra.extend``);
* search: one question at a time, ``index.search(query [1, 384], k)`` as the retriever calls
  it: the query starts on the CPU (where the embedder returns it) and the hits end as Python
  ``(id, score)`` lists; the device is synchronised before and after; median and p90;
* batch: all questions in one ``search`` call (median of 5), as questions per second;
* recall@k: mean over questions of ``|found ∩ exact| / k``, exact being a brute-force fp32
  top-k on the device (an id within 1e-5 of the k-th best score counts: fp32 ties). The
  ExactIndex must score 1.0, which checks its bookkeeping through build and extend;
* embed: one question through the embedder on the same device (median, p90), and
  ``embed + search`` per question.

Corpus: MiniLM embeddings of LoCoMo's texts (observations and dialogue turns, 8,414 unique in
``locomo10.json``) in a seeded order. For N beyond them, row j is real row ``j mod s`` plus Gaussian
noise of expected norm ``noise`` (0.5), renormalised: that keeps the clustered structure of real
text, which graph indexes depend on; uniform random 384-d vectors are a worst case for any graph
index (CAGRA recall@50 0.14 on them, ``shared/gpu/cuvs/README.md``). A noisy copy sits at cosine
1/sqrt(1 + 0.5²) ≈ 0.89 from its real row, so the 100k corpus is denser than LoCoMo's own texts
(median nearest-neighbour cosine 0.90 against 0.72 for the real rows); the JSON gives both, and
``--noise`` changes it. Queries: LoCoMo questions (categories 1-4), a seeded sample, embedded by the
same model.

A GPU machine without MiniLM's weights or LoCoMo runs from exported vectors (``.npz``:
``corpus`` [s, 384], ``queries`` [q, 384], ``query_texts`` [q]) and, for the embed timing,
MiniLM's architecture with random weights built from its ``config.json`` and tokenizer files
(exported beside the vectors, under 1 MB): latency does not depend on weight values.

Commands (repository root)::

    # CPU, exact only (embeds LoCoMo with the packaged MiniLM first: minutes on 2 cores)
    inferscale-assistant bench retrieval --json docs/results/retrieval-cpu.json \\
        --plot docs/results/retrieval-cpu.png --md docs/BENCHMARKS.md
    # export the vectors and MiniLM's config + tokenizer for the GPU machine (~17 MB)
    inferscale-assistant bench retrieval --export-vectors .gpu/retrieval/vectors.npz
    # H200 with the cuVS kit installed (shared/gpu/cuvs/README.md), .gpu/retrieval carried:
    bash .gpu/cuvs/device.sh _run python3 -m bench.retrieval "$OUT" \\
        --vectors .gpu/retrieval/vectors.npz
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import random
import shlex
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from bench.arguments import parse_ks
from bench.report import (
    figure,
    footnote,
    percentile,
    provenance,
    save_figure,
    write_json,
)
from inferscale_core.vector_index import (
    CagraIndex,
    ExactIndex,
    IndexUnavailableError,
    VectorIndex,
)

if TYPE_CHECKING:
    from inferscale_core.embedder import Embedder

MODEL_NAME = "all-MiniLM-L6-v2"
DEFAULT_SIZES = (10_000, 100_000)
KINDS = ("exact", "cagra")
EXTEND_ROWS = 1_000  # rows added to a built index (at most N/10)
NOISE = 0.5  # expected norm of the noise added to a real row for a synthetic one
TIE_TOLERANCE = 1e-5  # a found id this close to the k-th best exact score counts as a hit
BATCH_REPEATS = 5
STRUCTURE_SAMPLE = 200  # rows whose nearest-neighbour cosine describes a corpus
WARMUP_ROWS = 8_192  # the throw-away run before timing (CAGRA JIT-compiles on first use)
# What the embed timing needs of a sentence-transformers folder besides the weights (< 1 MB).
MINILM_SMALL_FILES = (
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "modules.json",
    "sentence_bert_config.json",
    "1_Pooling/config.json",
)
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


class EncoderUnavailableError(RuntimeError):
    """No way to time query embedding here; the message says what is missing."""


@dataclass(slots=True)
class RetrievalVectors:
    """The real vectors a run starts from (before the corpus is expanded to N rows)."""

    corpus: torch.Tensor  # [s, dim] float32 unit rows: LoCoMo texts, seeded order, CPU
    queries: torch.Tensor  # [q, dim] float32 unit rows: LoCoMo questions, CPU
    query_texts: list[str]  # [q] the questions (for the embed timing); may be empty
    source: dict[str, Any] = field(default_factory=dict)  # where they came from, for the JSON

    def __post_init__(self) -> None:
        if self.corpus.dim() != 2 or self.queries.dim() != 2:
            raise ValueError("corpus and queries must be [rows, dim]")
        if self.corpus.shape[1] != self.queries.shape[1]:
            raise ValueError(
                f"corpus dim {self.corpus.shape[1]} != queries dim {self.queries.shape[1]}"
            )
        if self.query_texts and len(self.query_texts) != self.queries.shape[0]:
            raise ValueError(
                f"{len(self.query_texts)} query texts for {self.queries.shape[0]} queries"
            )
        self.corpus = F.normalize(self.corpus.to("cpu", torch.float32), dim=1)
        self.queries = F.normalize(self.queries.to("cpu", torch.float32), dim=1)

    @property
    def dim(self) -> int:
        return self.corpus.shape[1]


@dataclass(slots=True)
class QueryEncoder:
    """One question -> its ``[1, dim]`` unit vector on the CPU, and what computes it."""

    embed: Callable[[str], torch.Tensor]
    description: str
    weights: str  # "trained" or "random"


# ---- the vectors ---------------------------------------------------------------------------


def locomo_texts(data: Path) -> list[str]:
    """LoCoMo's observations and dialogue turns (as the product imports them), unique, sorted."""
    from bench.locomo_data import load, observations
    from inferscale_core.importers.locomo import parse

    texts = [o.text for sample in load(data) for o in observations(sample)]
    texts += [turn.text for conversation in parse(data) for turn in conversation.turns]
    return sorted({t.strip() for t in texts if t.strip()})


def locomo_vectors(
    data: Path,
    embedder: Embedder,
    *,
    texts: int | None = None,
    questions: int | None = None,
    seed: int = 0,
) -> RetrievalVectors:
    """Embed LoCoMo's texts (a seeded order; the first ``texts`` of it) and ``questions``
    of its questions (a seeded sample; all of categories 1-4 when None) with ``embedder``."""
    from bench.locomo_data import load, sample_questions
    from bench.locomo_data import questions as all_questions

    unique = locomo_texts(data)
    random.Random(seed).shuffle(unique)
    chosen = unique if texts is None else unique[:texts]
    asked = sample_questions(all_questions(load(data)), questions, seed)
    query_texts = [q.question for q in asked]
    return RetrievalVectors(
        corpus=embedder.embed(chosen),  # [s, dim]
        queries=embedder.embed(query_texts),  # [q, dim]
        query_texts=query_texts,
        source={
            "data": str(data),
            "texts": f"LoCoMo observations + dialogue turns: {len(chosen)} of {len(unique)}"
            " unique texts (seeded order)",
            "questions": f"{len(asked)} LoCoMo questions (categories 1-4), seed {seed}",
            "embedder": getattr(embedder, "name", type(embedder).__name__),
        },
    )


def save_vectors(vectors: RetrievalVectors, path: Path) -> None:
    """``path`` (.npz): ``corpus``, ``queries`` (float32), ``query_texts``, ``source`` (JSON)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:  # np.savez would append ".npz" to another suffix
        np.savez(
            f,
            corpus=vectors.corpus.numpy(),
            queries=vectors.queries.numpy(),
            query_texts=np.array(vectors.query_texts, dtype=str),
            source=np.array(json.dumps(vectors.source)),
        )


def load_vectors(path: Path) -> RetrievalVectors:
    """Vectors from an ``.npz`` with ``corpus`` [s, dim] and ``queries`` [q, dim] (float16 or
    float32; rows are renormalised) and optionally ``query_texts`` [q] and ``source``."""
    with np.load(Path(path), allow_pickle=False) as npz:
        missing = {"corpus", "queries"} - set(npz.files)
        if missing:
            raise ValueError(f"{path} lacks {sorted(missing)} (has {sorted(npz.files)})")
        texts = [str(t) for t in npz["query_texts"]] if "query_texts" in npz.files else []
        source = json.loads(str(npz["source"])) if "source" in npz.files else {}
        return RetrievalVectors(
            corpus=torch.from_numpy(npz["corpus"].astype(np.float32)),
            queries=torch.from_numpy(npz["queries"].astype(np.float32)),
            query_texts=texts,
            source={**source, "file": str(path)},
        )


def minilm_config_dir(vectors_path: Path) -> Path:
    """Where :func:`export_vectors` puts MiniLM's small files: ``x.npz`` -> ``x.minilm/``."""
    return Path(vectors_path).with_suffix(".minilm")


def export_vectors(
    path: Path, data: Path, embedder: Embedder, model_dir: Path, seed: int = 0
) -> dict[str, Any]:
    """Embed all of LoCoMo's texts and questions into ``path`` (.npz), and copy the model's
    config and tokenizer files (not its weights) to :func:`minilm_config_dir`."""
    vectors = locomo_vectors(data, embedder, seed=seed)
    save_vectors(vectors, path)
    config_dir = minilm_config_dir(path)
    copied = copy_minilm_config(model_dir, config_dir)
    return {
        "vectors": str(path),
        "vectors_bytes": Path(path).stat().st_size,
        "corpus_rows": vectors.corpus.shape[0],
        "queries": vectors.queries.shape[0],
        "minilm_config": str(config_dir),
        "minilm_config_bytes": copied,
    }


def copy_minilm_config(model_dir: Path, dest: Path) -> int:
    """Copy a sentence-transformers folder's :data:`MINILM_SMALL_FILES` (not its weights) into
    ``dest``; returns the bytes copied."""
    copied = 0
    for name in MINILM_SMALL_FILES:
        source = Path(model_dir) / name
        if source.is_file():
            (Path(dest) / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, Path(dest) / name)
            copied += source.stat().st_size
    return copied


def expand_corpus(real: torch.Tensor, n: int, noise: float = NOISE, seed: int = 0) -> torch.Tensor:
    """``[n, dim]`` unit rows: the first ``n`` real rows, then (beyond them) real row
    ``j mod s`` plus Gaussian noise of expected norm ``noise``, renormalised."""
    s, dim = real.shape  # real: [s, dim]
    if n <= s:
        return real[:n]
    generator = torch.Generator().manual_seed(seed)
    extra = torch.arange(n - s) % s  # [n - s] the real row each synthetic row varies
    jitter = torch.randn(n - s, dim, generator=generator) * (noise / math.sqrt(dim))
    return torch.cat([real, F.normalize(real[extra] + jitter, dim=1)])  # [n, dim]


# ---- query embedding -----------------------------------------------------------------------


class MiniLMForward:
    """MiniLM as sentence-transformers runs it (tokenize, BERT, mean pooling, L2 norm) with
    transformers alone: the folder's weights, or random ones from its config.json if it has
    none (latency does not depend on weight values)."""

    def __init__(self, folder: Path, device: torch.device) -> None:
        from transformers import AutoConfig, AutoModel, AutoTokenizer

        folder = Path(folder)
        self.device = device
        self.tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        self.trained = any((folder / name).is_file() for name in WEIGHT_FILES)
        if self.trained:
            model = AutoModel.from_pretrained(str(folder), local_files_only=True)
        else:
            config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
            torch.manual_seed(0)
            model = AutoModel.from_config(config)
        self.model = model.to(device).eval()
        self.max_length = _max_seq_length(folder)

    def __call__(self, text: str) -> torch.Tensor:
        batch = self.tokenizer(
            [text], truncation=True, max_length=self.max_length, return_tensors="pt"
        ).to(self.device)
        with torch.inference_mode():
            hidden = self.model(**batch).last_hidden_state  # [1, T, dim]
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # [1, T, 1]
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)  # [1, dim]
            return F.normalize(pooled, dim=1).to("cpu")


def _max_seq_length(folder: Path) -> int:
    with contextlib.suppress(OSError, ValueError, KeyError):
        return int(json.loads((folder / "sentence_bert_config.json").read_text())["max_seq_length"])
    return 256  # all-MiniLM-L6-v2's


def open_query_encoder(device: str | torch.device, model_dir: Path | None = None) -> QueryEncoder:
    """The product's embedder on ``device`` when sentence-transformers and the weights are
    here; else :class:`MiniLMForward` (random weights when the folder has none).

    ``model_dir`` defaults to the packaged MiniLM; :class:`EncoderUnavailableError` if neither
    is usable.
    """
    device = torch.device(device)
    folder = Path(model_dir) if model_dir is not None else _packaged_minilm()
    if not (folder / "config.json").is_file():
        raise EncoderUnavailableError(f"{folder} has no config.json (MiniLM's architecture)")
    has_weights = any((folder / name).is_file() for name in WEIGHT_FILES)
    if has_weights and (folder / "modules.json").is_file() and _has_sentence_transformers():
        from inferscale_core.embedder import SentenceTransformerEmbedder

        embedder = SentenceTransformerEmbedder(folder, device=str(device))
        return QueryEncoder(
            lambda text: embedder.embed([text]),  # [1, dim] on the CPU
            f"SentenceTransformerEmbedder ({embedder.name}) on {device}",
            "trained",
        )
    try:
        forward = MiniLMForward(folder, device)
    except (ImportError, OSError, ValueError) as e:
        raise EncoderUnavailableError(f"can't load MiniLM's architecture from {folder}: {e}") from e
    how = "its weights" if forward.trained else "random weights from config.json"
    return QueryEncoder(
        forward,
        f"transformers {type(forward.model).__name__} + mean pooling ({folder}, {how}) on {device}",
        "trained" if forward.trained else "random",
    )


def _packaged_minilm() -> Path:
    try:
        from inferscale_core.model_files import ModelSetupError, minilm_dir
    except ImportError as e:
        raise EncoderUnavailableError(f"no packaged MiniLM here ({e}); pass its folder") from e
    try:
        return minilm_dir()
    except ModelSetupError as e:
        raise EncoderUnavailableError(str(e)) from e


def _has_sentence_transformers() -> bool:
    import importlib.util

    return importlib.util.find_spec("sentence_transformers") is not None


# ---- measuring -----------------------------------------------------------------------------


def resolve_device(device: str | torch.device) -> torch.device:
    """``"auto"`` -> CUDA when torch sees a GPU, else the CPU."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def new_index(kind: str, dim: int, device: torch.device) -> VectorIndex:
    """An empty index of ``kind``; :class:`IndexUnavailableError` if it can't run here."""
    if kind == "exact":
        return ExactIndex(dim, device)
    if kind == "cagra":
        return CagraIndex(dim, device)
    raise ValueError(f"unknown index kind {kind!r} (known: {', '.join(KINDS)})")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], Any], device: torch.device) -> tuple[float, Any]:
    """``(seconds, fn())`` with the device synchronised before and after."""
    _sync(device)
    t0 = time.perf_counter()
    out = fn()
    _sync(device)
    return time.perf_counter() - t0, out


def _recall(
    found: Sequence[Sequence[tuple[int, float]]], exact_scores: torch.Tensor, k: int
) -> float:
    """Mean over queries of the share of the exact top ``k`` found (ids are corpus rows).

    ``exact_scores`` is ``[q, n]``; a found id counts when its exact score reaches the k-th
    best within :data:`TIE_TOLERANCE`.
    """
    kth = exact_scores.topk(k, dim=1).values[:, -1]  # [q]
    shares = []
    for q, hits in enumerate(found):
        rows = torch.tensor([fid for fid, _ in hits], dtype=torch.long)  # [<= k]
        scores = exact_scores[q, rows.to(exact_scores.device)]  # [<= k]
        shares.append(min(k, int((scores >= kth[q] - TIE_TOLERANCE).sum())) / k)
    return statistics.fmean(shares)


def _nn_cosine_median(corpus: torch.Tensor, device: torch.device, seed: int) -> float:
    """Median over a sample of rows of the cosine to their nearest other row."""
    n = corpus.shape[0]
    picked = sorted(random.Random(seed).sample(range(n), min(STRUCTURE_SAMPLE, n)))
    data = corpus.to(device)  # [n, dim]
    scores = data[torch.tensor(picked, device=device)] @ data.T  # [p, n]
    scores[torch.arange(len(picked), device=device), torch.tensor(picked, device=device)] = -2.0
    return float(scores.max(dim=1).values.median())


def _measure(
    kind: str,
    corpus: torch.Tensor,
    queries: torch.Tensor,
    exact_scores: torch.Tensor,
    k: int,
    device: torch.device,
    extend_rows: int,
    embed_s: Sequence[float],
) -> dict[str, Any]:
    """One index of ``kind`` over ``corpus`` ([n, dim], CPU): build, extend, search, recall."""
    n, dim = corpus.shape
    m = min(extend_rows, n // 10)
    ids = list(range(n))  # id = corpus row, so hits compare with the exact scores' columns
    index = new_index(kind, dim, device)
    build_s, _ = _timed(lambda: index.add(ids[: n - m], corpus[: n - m]), device)
    extend_s, _ = _timed(lambda: index.add(ids[n - m :], corpus[n - m :]), device)
    if len(index) != n:
        raise AssertionError(f"{kind} index holds {len(index)} of {n} vectors")
    search_s, found = [], []
    for q in range(queries.shape[0]):
        seconds, hits = _timed(lambda q=q: index.search(queries[q : q + 1], k), device)
        search_s.append(seconds)
        found.append(hits[0])
    index.search(queries, k)  # warm the batched path
    batches = [_timed(lambda: index.search(queries, k), device) for _ in range(BATCH_REPEATS)]
    batch_s = statistics.median(seconds for seconds, _ in batches)
    row: dict[str, Any] = {
        "n": n,
        "index": kind,
        "build_rows": n - m,
        "build_s": build_s,
        "extend_rows": m,
        "extend_s": extend_s if m else None,
        "search_s_median": statistics.median(search_s),
        "search_s_p90": percentile(search_s, 0.9),
        "recall_at_k": _recall(found, exact_scores, k),
        "batch_queries": queries.shape[0],
        "batch_s_median": batch_s,
        "batch_queries_per_s": queries.shape[0] / batch_s,
        "batch_recall_at_k": _recall(batches[-1][1], exact_scores, k),
        "search_s": search_s,
    }
    if kind == "cagra":
        row["graph"] = n - m >= index.min_graph_rows  # else CagraIndex searches exactly
    if embed_s:
        total = [e + s for e, s in zip(embed_s, search_s, strict=True)]
        row["embed_plus_search_s_median"] = statistics.median(total)
        row["embed_plus_search_s_p90"] = percentile(total, 0.9)
    return row


def _time_embedding(
    encoder: QueryEncoder, texts: Sequence[str], device: torch.device
) -> dict[str, Any]:
    for text in texts[:3]:  # warm-up (first CUDA kernels, tokenizer caches)
        encoder.embed(text)
    samples = []
    for text in texts:
        seconds, vector = _timed(lambda text=text: encoder.embed(text), device)
        if vector.shape[0] != 1:
            raise AssertionError(f"one text gave {tuple(vector.shape)}")
        samples.append(seconds)
    return {
        "model": encoder.description,
        "weights": encoder.weights,
        "weights_note": (
            "trained MiniLM weights"
            if encoder.weights == "trained"
            else "random weights in MiniLM's architecture: latency does not depend on weight values"
        ),
        "s_median": statistics.median(samples),
        "s_p90": percentile(samples, 0.9),
        "s": samples,
    }


def run_retrieval(
    vectors: RetrievalVectors,
    sizes: Sequence[int] = DEFAULT_SIZES,
    *,
    k: int = 50,
    queries: int = 200,
    device: str | torch.device = "auto",
    kinds: Sequence[str] = KINDS,
    encoder: QueryEncoder | None = None,
    embed_model_dir: Path | None = None,
    extend_rows: int = EXTEND_ROWS,
    noise: float = NOISE,
    seed: int = 0,
    command: str | None = None,
    on_progress: Callable[[str], None] = lambda message: None,
) -> dict[str, Any]:
    """Measure and return the JSON-ready result (``{"bench": "retrieval", "rows": [...]}``).

    ``encoder`` times query embedding (default: :func:`open_query_encoder` on ``device`` with
    ``embed_model_dir``); without one, or without ``vectors.query_texts``, the embed timing is
    reported skipped with the reason, like an index kind that can't run here.
    """
    device = resolve_device(device)
    sizes = sorted(set(sizes))
    if not sizes or min(sizes) < max(k, 1):
        raise ValueError(f"sizes must be >= k={k}, got {sizes}")
    header = provenance("retrieval", MODEL_NAME, command)
    total = vectors.queries.shape[0]
    chosen = sorted(random.Random(seed).sample(range(total), min(queries, total)))
    query_vectors = vectors.queries[chosen]  # [q, dim] CPU, as the embedder returns them
    skipped: dict[str, str] = {}

    embed: dict[str, Any] | None = None
    if not vectors.query_texts:
        skipped["embed"] = "the vectors file has no query_texts"
    else:
        try:
            if encoder is None:
                on_progress("loading the query embedder")
                encoder = open_query_encoder(device, embed_model_dir)
            on_progress(f"timing {len(chosen)} query embeddings")
            embed = _time_embedding(encoder, [vectors.query_texts[i] for i in chosen], device)
        except EncoderUnavailableError as e:
            skipped["embed"] = str(e)

    available = []
    for kind in kinds:
        try:
            new_index(kind, vectors.dim, device)
            available.append(kind)
        except IndexUnavailableError as e:
            skipped[kind] = str(e)

    real_nn_cosine = _nn_cosine_median(vectors.corpus, device, seed)
    embed_s = embed["s"] if embed else []
    warm_n = min(sizes[0], WARMUP_ROWS)
    warm = expand_corpus(vectors.corpus, warm_n, noise, seed)  # [warm_n, dim]
    warm_scores = query_vectors[:10].to(device) @ warm.to(device).T  # [10, warm_n]
    failed: dict[str, str] = {}  # "kind@N" -> the error: one broken cell must not lose the run
    for kind in list(available):
        on_progress(f"warming up {kind} on {warm_n} rows")
        try:
            _measure(kind, warm, query_vectors[:10], warm_scores, k, device, extend_rows, [])
        except Exception as e:  # recorded in the JSON; the other kinds go on
            failed[f"{kind}@warm-up"] = f"{type(e).__name__}: {e}"
            available.remove(kind)

    rows, corpora = [], []
    for n in sizes:
        corpus = expand_corpus(vectors.corpus, n, noise, seed)  # [n, dim] CPU
        exact_scores = query_vectors.to(device) @ corpus.to(device).T  # [q, n]
        real = min(n, vectors.corpus.shape[0])
        corpora.append(
            {
                "n": n,
                "real_rows": real,
                "synthetic_rows": n - real,
                "nn_cosine_median": _nn_cosine_median(corpus, device, seed),
            }
        )
        for kind in available:
            on_progress(f"N={n}: {kind}")
            try:
                rows.append(
                    _measure(
                        kind, corpus, query_vectors, exact_scores, k, device, extend_rows, embed_s
                    )
                )
            except Exception as e:  # recorded in the JSON; the run goes on
                failed[f"{kind}@{n}"] = f"{type(e).__name__}: {e}"
            if device.type == "cuda":
                torch.cuda.empty_cache()  # the index is gone with _measure's frame
        del exact_scores

    if "cagra" in available:
        with contextlib.suppress(ImportError, AttributeError):
            import cuvs

            header["versions"]["cuvs"] = cuvs.__version__
    cagra_params = None
    if "cagra" in available:
        probe = CagraIndex(vectors.dim, device)
        cagra_params = {
            "graph_degree": probe.graph_degree,
            "intermediate_graph_degree": probe.intermediate_graph_degree,
            "itopk_size": max(probe.itopk_size, 32 * math.ceil(k / 32)),
            "min_graph_rows": probe.min_graph_rows,
            "metric": "inner_product",
        }
    return {
        **header,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "k": k,
        "queries": len(chosen),
        "sizes": sizes,
        "seed": seed,
        "corpus": {
            "real_rows": vectors.corpus.shape[0],
            "dim": vectors.dim,
            "source": vectors.source,
            "expansion": (
                f"for N beyond the real rows, row j is real row j mod {vectors.corpus.shape[0]}"
                f" plus Gaussian noise of expected norm {noise}, renormalised: it keeps the"
                " clustered structure of real text, unlike uniform random vectors"
            ),
            "noise": noise,
            "real_nn_cosine_median": real_nn_cosine,
        },
        "corpora": corpora,
        "timing": (
            "one query per search call, as the retriever searches: the query starts on the CPU"
            " and the hits end as Python lists; device synchronised around every call; build"
            f" and extend include the copy to the device; {len(available)} index kind(s) warmed"
            f" up on {warm_n} rows first (CAGRA compiles its kernels on first use)"
        ),
        "recall": (
            f"mean over queries of |found ∩ exact top-{k}| / {k}, exact = fp32 brute force on"
            f" the device; ids within {TIE_TOLERANCE} of the k-th best score count (fp32 ties)"
        ),
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "cagra_params": cagra_params,
        "embed": embed,
        "skipped": skipped,
        "failed": failed,
        "rows": rows,
    }


# ---- reporting -----------------------------------------------------------------------------


def headline(result: dict[str, Any]) -> str:
    k = result["k"]
    by_n: dict[int, list[str]] = {}
    for row in result["rows"]:
        text = f"{row['index']} {row['search_s_median'] * 1e3:.2f} ms"
        if row["index"] != "exact":
            text += f" (recall@{k} {row['recall_at_k']:.3f})"
        by_n.setdefault(row["n"], []).append(text)
    parts = [f"N={n}: " + ", ".join(texts) for n, texts in by_n.items()]
    embed = result.get("embed")
    if embed:
        parts.append(f"embed {embed['s_median'] * 1e3:.1f} ms ({embed['weights']} weights)")
    parts += [f"{what} skipped: {why}" for what, why in result["skipped"].items()]
    parts += [f"{cell} FAILED: {why}" for cell, why in result.get("failed", {}).items()]
    return f"top-{k} search, one query, {result['device']}: " + "; ".join(parts)


def plot(result: dict[str, Any], path: Path) -> None:
    fig, ax = figure()
    k = result["k"]
    colors = {"exact": "tab:blue", "cagra": "tab:orange"}
    for kind in dict.fromkeys(row["index"] for row in result["rows"]):
        rows = sorted((r for r in result["rows"] if r["index"] == kind), key=lambda r: r["n"])
        ns = [r["n"] for r in rows]
        color = colors.get(kind)
        ax.plot(ns, [r["search_s_median"] * 1e3 for r in rows], "o-", color=color, label=kind)
        ax.plot(ns, [r["search_s_p90"] * 1e3 for r in rows], ":", color=color, alpha=0.6)
        annotated = rows if kind != "exact" else []  # exact search's recall is 1 by definition
        for r in annotated:
            ax.annotate(
                f"recall@{k} {r['recall_at_k']:.3f}",
                (r["n"], r["search_s_median"] * 1e3),
                textcoords="offset points",
                xytext=(0, -12),
                ha="center",
                fontsize=7,
                color=color,
            )
    embed = result.get("embed")
    if embed:
        ax.axhline(
            embed["s_median"] * 1e3,
            color="tab:gray",
            linestyle="--",
            label=f"embed one question ({embed['weights']} weights)",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.margins(x=0.12)  # room for the recall labels at both ends
    ax.set_xlabel("facts in the index (N)")
    ax.set_ylabel("ms per query (median; dotted: p90)")
    title = f"Top-{k} search, one query at a time — {result['device_name']}"
    skipped = "; ".join(f"{what} skipped: {why}" for what, why in result["skipped"].items())
    ax.set_title(f"{title}\n{skipped}" if skipped else title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.text(0.01, 0.005, footnote(result), fontsize=6, alpha=0.7)
    save_figure(fig, path)


# ---- python -m bench.retrieval OUT_DIR --vectors FILE ----------------------


def _sizes(text: str) -> list[int]:
    try:
        sizes = parse_ks(text, "--sizes")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if sizes[0] < 1:
        raise argparse.ArgumentTypeError(f"sizes must be >= 1, got {text!r}")
    return sizes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.retrieval",
        description="Embed + top-k search time, exact vs CAGRA, from exported vectors"
        " (inferscale-assistant bench retrieval --export-vectors FILE); writes"
        " OUT_DIR/retrieval.json (and retrieval.png when matplotlib is here).",
    )
    parser.add_argument("out_dir", type=Path, help="folder for retrieval.json")
    parser.add_argument("--vectors", type=Path, required=True, help="the exported .npz")
    parser.add_argument(
        "--minilm-config",
        type=Path,
        metavar="DIR",
        help="MiniLM folder for the embed timing: config.json + tokenizer files, weights optional"
        " (default: the .minilm folder beside --vectors if present, else the packaged MiniLM)",
    )
    parser.add_argument("--sizes", type=_sizes, default=list(DEFAULT_SIZES), help="N values")
    parser.add_argument("--k", type=int, default=50, help="top-k (50)")
    parser.add_argument("--queries", type=int, default=200, help="questions, seeded (200)")
    parser.add_argument("--device", default="auto", help="auto (CUDA if present), cpu, cuda")
    parser.add_argument(
        "--noise", type=float, default=NOISE, help=f"noise norm of synthetic rows ({NOISE})"
    )
    parser.add_argument("--seed", type=int, default=0, help="sampling and noise seed (0)")
    args = parser.parse_args(argv)

    beside = minilm_config_dir(args.vectors)
    model_dir = args.minilm_config or (beside if beside.is_dir() else None)
    command = shlex.join(
        [
            "python",
            "-m",
            "bench.retrieval",
            *(sys.argv[1:] if argv is None else argv),
        ]
    )
    result = run_retrieval(
        load_vectors(args.vectors),
        args.sizes,
        k=args.k,
        queries=args.queries,
        device=args.device,
        embed_model_dir=model_dir,
        noise=args.noise,
        seed=args.seed,
        command=command,
        on_progress=lambda message: print(message, file=sys.stderr, flush=True),
    )
    write_json(result, args.out_dir / "retrieval.json")
    print(headline(result), flush=True)
    try:
        plot(result, args.out_dir / "retrieval.png")
    except ImportError as e:
        print(f"no plot: {e}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
