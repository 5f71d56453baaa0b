"""Vector indexes: fact ids -> unit vectors, top-k by inner product (cosine on unit vectors).

* :class:`ExactIndex`: one torch matmul + topk over every stored vector (CPU or CUDA). Exact,
  and fast enough for the tens of thousands of facts of a profile. On a CPU with native
  bfloat16 it scans a bfloat16 copy and re-scores the best candidates in float32, with a
  bound that proves the result is float32's (else it scans in float32).
* :class:`CagraIndex`: cuVS CAGRA graph search on the GPU, for much larger profiles.
* :func:`make_index`: picks one of them.

Both are upserts keyed by id: adding an id again replaces its vector. Scores are inner
products (cosine similarity when vectors are L2-normalised, as the embedder's are), best first.
An index is used by one thread at a time (like the fact log it is built from).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from inferscale_core.cpu_features import native_bfloat16

logger = logging.getLogger(__name__)

# make_index's default: below this many vectors, exact search. Measured on the H200 (top-50, one
# query, docs/BENCHMARKS.md): exact 0.16 ms at 10k and 0.23 ms at 100k rows, always recall 1.0;
# CAGRA 1.7 ms at both, recall@50 0.998 / 0.911; exact only loses near 1M rows (0.52 ms against
# CAGRA's 0.4 ms in the kit's own measurement).
CAGRA_THRESHOLD = 1_000_000


class IndexUnavailableError(RuntimeError):
    """The index can't run here (no CUDA, no cuVS); the message says what is missing."""


@runtime_checkable
class VectorIndex(Protocol):
    """What the retriever needs from an index."""

    @property
    def dim(self) -> int: ...

    def add(self, ids: Sequence[int], vectors: torch.Tensor) -> None:
        """Insert or replace: ``vectors`` is ``[len(ids), dim]``; a repeated id keeps its last."""
        ...

    def remove(self, ids: Sequence[int]) -> None:
        """Drop these ids; ids not in the index are ignored."""
        ...

    def search(self, queries: torch.Tensor, k: int) -> list[list[tuple[int, float]]]:
        """Per query of ``[q, dim]``: up to ``k`` ``(id, score)``, best first."""
        ...

    def vectors(self, ids: Sequence[int]) -> tuple[list[int], torch.Tensor]:
        """Those ``ids`` the index holds, in order, and their rows ``[n, dim]`` (float32, on
        the CPU; ``[0, dim]`` when none): the stored vectors, without reading the log."""
        ...

    def __len__(self) -> int: ...

    def __contains__(self, fact_id: object) -> bool: ...


# ExactIndex's bfloat16 scan: candidates re-scored in float32 per query (at least k + this).
SCAN_MARGIN = 32
_UNIT_ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


class ExactIndex:
    """Exact search: ``queries @ vectors.T`` then ``topk``, on ``device`` (CPU or CUDA).

    Vectors live in rows ``[0, n)`` of a growable ``[capacity, dim]`` buffer (capacity doubles
    when full). Removing an id moves the last row into its hole, so rows stay dense and a
    remove is O(1).

    With ``scan_dtype`` (bfloat16 on a CPU that computes it natively, :func:`make_index`) a
    copy of the rows in that dtype is kept too, and a search scans it (half the bytes of
    float32: at 10k facts on the 2-vCPU AMD EPYC 0.3 ms instead of 0.4-1.8), takes the
    ``max(2k, k + SCAN_MARGIN)`` best rows, and re-scores them from the float32 rows. The result
    is float32's: a score read from the copy is within ``eps = 4u * |q| * max|row|`` of the
    float32 one (u = the dtype's unit roundoff: both operands and the output rounded once,
    float32 sums), so when the k-th re-scored score beats the last candidate's scan score by
    ``eps``, no row left out can be better; for a query where it does not, the float32 rows
    are scanned whole.
    """

    def __init__(
        self,
        dim: int,
        device: str | torch.device = "cpu",
        capacity: int = 256,
        scan_dtype: torch.dtype | None = None,
    ) -> None:
        if dim <= 0:
            raise ValueError(f"dim must be > 0, got {dim}")
        if scan_dtype is not None and scan_dtype not in _UNIT_ROUNDOFF:
            raise ValueError(f"scan_dtype must be one of {list(_UNIT_ROUNDOFF)}, got {scan_dtype}")
        self._dim = dim
        self.device = torch.device(device)
        self._data = torch.zeros(max(capacity, 1), dim, device=self.device)  # [capacity, dim]
        self.scan_dtype = scan_dtype
        self._scan = (  # [capacity, dim] in scan_dtype, rows as _data's
            None if scan_dtype is None else torch.zeros_like(self._data, dtype=scan_dtype)
        )
        self._max_norm = 0.0  # of any row ever added: a bound for eps, never lowered
        self._ids: list[int] = []  # row -> id
        self._rows: dict[int, int] = {}  # id -> row
        self.full_scans = 0  # searches whose bound failed (scan_dtype only): for tests, benches

    @property
    def dim(self) -> int:
        return self._dim

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, fact_id: object) -> bool:
        return fact_id in self._rows

    def add(self, ids: Sequence[int], vectors: torch.Tensor) -> None:
        ids, vectors = _check_batch(ids, vectors, self._dim, self.device)  # vectors: [m, dim]
        rows = []
        for fid in ids:
            row = self._rows.get(fid)
            if row is None:
                row = self._rows[fid] = len(self._ids)
                self._ids.append(fid)
            rows.append(row)
        self._data = _reserve(self._data, len(self._ids))
        if self._scan is not None:
            self._scan = _reserve(self._scan, len(self._ids))
        if rows:
            at = torch.tensor(rows, device=self.device)
            self._data[at] = vectors
            if self._scan is not None:
                self._scan[at] = vectors.to(self._scan.dtype)
                self._max_norm = max(self._max_norm, float(vectors.norm(dim=1).max()))

    def remove(self, ids: Sequence[int]) -> None:
        for fid in ids:
            row = self._rows.pop(int(fid), None)
            if row is None:
                continue
            last = len(self._ids) - 1
            moved = self._ids.pop()
            if row != last:  # fill the hole with the last row
                self._data[row] = self._data[last]
                if self._scan is not None:
                    self._scan[row] = self._scan[last]
                self._ids[row] = moved
                self._rows[moved] = row

    def vectors(self, ids: Sequence[int]) -> tuple[list[int], torch.Tensor]:
        return _rows_of(ids, self._rows, self._data, self._dim)

    def search(self, queries: torch.Tensor, k: int) -> list[list[tuple[int, float]]]:
        queries = _check_queries(queries, self._dim, self.device)  # [q, dim]
        n = len(self._ids)
        if n == 0 or _check_k(k) == 0:
            return [[] for _ in range(queries.shape[0])]
        k = min(k, n)
        candidates = max(2 * k, k + SCAN_MARGIN)
        if self._scan is None or candidates >= n:
            values, rows = (queries @ self._data[:n].T).topk(k, dim=1)  # [q, k] best first
            return _pairs(values, rows, self._ids)
        return self._scanned(queries, k, candidates)

    def _scanned(
        self, queries: torch.Tensor, k: int, candidates: int
    ) -> list[list[tuple[int, float]]]:
        """:meth:`search` through the ``scan_dtype`` copy (class docstring)."""
        assert self._scan is not None and self.scan_dtype is not None
        n = len(self._ids)
        rough = queries.to(self.scan_dtype) @ self._scan[:n].T  # [q, n]
        rough_top, cand = rough.float().topk(candidates, dim=1)  # [q, c] best first
        exact = torch.einsum("qcd,qd->qc", self._data[cand], queries)  # [q, c] float32
        values, order = exact.topk(k, dim=1)  # [q, k]
        rows = cand.gather(1, order)  # [q, k]
        eps = 4 * _UNIT_ROUNDOFF[self.scan_dtype] * queries.norm(dim=1) * self._max_norm  # [q]
        proven = (values[:, -1] >= rough_top[:, -1] + eps).tolist()  # [q]
        if not all(proven):
            unproven = torch.tensor([i for i, ok in enumerate(proven) if not ok])
            self.full_scans += len(unproven)
            full, full_rows = (queries[unproven] @ self._data[:n].T).topk(k, dim=1)
            values[unproven], rows[unproven] = full, full_rows
        return _pairs(values, rows, self._ids)


class CagraIndex:
    """Approximate search on the GPU with cuVS CAGRA, for profiles of many facts.

    Rows are append-only between builds; row r of the graph is row r of our own device copy of
    the vectors. ``add`` appends rows and ``cagra.extend``s the graph with them; ``remove`` (and
    the upsert of an existing id) only marks the old row dead in a bitset that the graph search
    filters with. When the rows appended or deleted since the last build exceed
    ``rebuild_every`` times the rows built, the live rows are compacted and the graph rebuilt.

    Below ``min_graph_rows`` live rows there is no graph, and for ``k > max_graph_k`` the graph
    is not asked: both search our device copy exactly. Scores are always recomputed from that
    copy (CAGRA only proposes candidates), so they equal :class:`ExactIndex`'s.

    Raises :class:`IndexUnavailableError` when ``device`` is not CUDA or cuVS is missing.
    """

    def __init__(
        self,
        dim: int,
        device: str | torch.device = "cuda",
        rebuild_every: float = 0.25,
        min_graph_rows: int = 4096,
        graph_degree: int = 32,
        intermediate_graph_degree: int = 128,  # lower (64) gave recall 0.05-0.3 on the H200
        itopk_size: int = 64,
        max_graph_k: int = 256,
    ) -> None:
        if dim <= 0:
            raise ValueError(f"dim must be > 0, got {dim}")
        if rebuild_every <= 0:
            raise ValueError(f"rebuild_every must be > 0, got {rebuild_every}")
        self.device = torch.device(device)
        self._cuvs = _load_cuvs(self.device)
        self._dim = dim
        self.rebuild_every = rebuild_every
        self.min_graph_rows = max(min_graph_rows, 2 * intermediate_graph_degree)
        self.graph_degree = graph_degree
        self.intermediate_graph_degree = intermediate_graph_degree
        self.itopk_size = itopk_size
        self.max_graph_k = max_graph_k
        self._data = torch.zeros(256, dim, device=self.device)  # [capacity, dim], graph row order
        self._alive = np.zeros(256, dtype=bool)  # [capacity] row is live
        self._ids: list[int] = []  # row -> id (also for dead rows, until the next build)
        self._rows: dict[int, int] = {}  # live id -> row
        self._graph: Any = None  # cagra.Index over rows [0, len(self._ids))
        self._graph_data: torch.Tensor | None = None  # cuVS may keep a view of it: keep it alive
        self._built = 0  # rows at the last build
        self._changed = 0  # rows appended or deleted since the last build
        self._filter: Any = None  # cached bitset Prefilter, None when stale

    @property
    def dim(self) -> int:
        return self._dim

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, fact_id: object) -> bool:
        return fact_id in self._rows

    def add(self, ids: Sequence[int], vectors: torch.Tensor) -> None:
        ids, vectors = _check_batch(ids, vectors, self._dim, self.device)  # vectors: [m, dim]
        if not ids:
            return
        self._kill([self._rows[fid] for fid in ids if fid in self._rows])  # upserts
        start, end = len(self._ids), len(self._ids) + len(ids)
        self._data = _reserve(self._data, end)
        if end > self._alive.size:
            self._alive = np.concatenate(
                [self._alive, np.zeros(self._data.shape[0] - self._alive.size, bool)]
            )
        self._data[start:end] = vectors
        self._alive[start:end] = True
        for row, fid in enumerate(ids, start):
            self._ids.append(fid)
            self._rows[fid] = row
        self._changed += len(ids)
        self._filter = None  # the bitset must cover the new rows
        if self._graph is not None and not self._rebuild_due():
            # cuVS 26.10's extend takes the whole dataset (the graph's rows, then the new ones)
            # and rebinds the index to it: keep it alive as long as the graph.
            cagra = self._cuvs.cagra
            data = self._data[:end].contiguous()  # [end, dim]
            cagra.extend(cagra.ExtendParams(), self._graph, data, start)
            self._graph_data = data
        self._maybe_rebuild()

    def remove(self, ids: Sequence[int]) -> None:
        wanted = dict.fromkeys(int(fid) for fid in ids)
        self._kill([self._rows[fid] for fid in wanted if fid in self._rows])
        self._maybe_rebuild()

    def vectors(self, ids: Sequence[int]) -> tuple[list[int], torch.Tensor]:
        return _rows_of(ids, self._rows, self._data, self._dim)  # live rows only

    def search(self, queries: torch.Tensor, k: int) -> list[list[tuple[int, float]]]:
        queries = _check_queries(queries, self._dim, self.device).contiguous()  # [q, dim]
        live = len(self._rows)
        if live == 0 or _check_k(k) == 0:
            return [[] for _ in range(queries.shape[0])]
        k = min(k, live)
        if self._graph is None or k > self.max_graph_k:
            return self._exact(queries, k)
        cagra = self._cuvs.cagra
        params = cagra.SearchParams(itopk_size=max(self.itopk_size, 32 * math.ceil(k / 32)))
        _, neighbors = cagra.search(params, self._graph, queries, k, filter=self._prefilter())
        out = []
        for q, candidates in enumerate(_host(neighbors).astype(np.int64)):  # [k] rows per query
            # Unfilled slots hold an out-of-range sentinel; re-check liveness on our side too.
            rows = [r for r in dict.fromkeys(candidates.tolist()) if self._is_live_row(r)]
            if not rows:
                out.append([])
                continue
            scores = self._data[torch.tensor(rows, device=self.device)] @ queries[q]  # [c]
            values, order = scores.sort(descending=True)
            out.append(
                [
                    (self._ids[rows[i]], v)
                    for i, v in zip(order.tolist(), values.tolist(), strict=True)
                ]
            )
        return out

    # -- helpers ----------------------------------------------------------------------------

    def _is_live_row(self, row: int) -> bool:
        return 0 <= row < len(self._ids) and bool(self._alive[row])

    def _exact(self, queries: torch.Tensor, k: int) -> list[list[tuple[int, float]]]:
        n = len(self._ids)
        scores = queries @ self._data[:n].T  # [q, n]
        dead = torch.from_numpy(~self._alive[:n]).to(self.device)  # [n]
        scores[:, dead] = -math.inf
        values, rows = scores.topk(k, dim=1)  # [q, k], k <= live rows
        return _pairs(values, rows, self._ids)

    def _kill(self, rows: list[int]) -> None:
        for row in rows:
            self._alive[row] = False
            del self._rows[self._ids[row]]
        if rows:
            self._changed += len(rows)
            self._filter = None

    def _rebuild_due(self) -> bool:
        return self._changed > self.rebuild_every * max(self._built, 1)

    def _maybe_rebuild(self) -> None:
        live, rows = len(self._rows), len(self._ids)
        if self._graph is None:
            if live >= self.min_graph_rows or rows - live > max(live, 256):
                self._rebuild()  # first graph, or compact the exact rows
        elif self._rebuild_due():
            self._rebuild()

    def _rebuild(self) -> None:
        """Compact the live rows to ``[0, live)`` and build a new graph over them."""
        keep = np.flatnonzero(self._alive[: len(self._ids)])  # [live] rows, in order
        data = self._data[torch.from_numpy(keep).to(self.device)].contiguous()  # [live, dim]
        self._ids = [self._ids[r] for r in keep.tolist()]
        self._rows = {fid: row for row, fid in enumerate(self._ids)}
        n = len(self._ids)
        self._data = _reserve(torch.zeros(max(n, 256), self._dim, device=self.device), n)
        self._data[:n] = data
        self._alive = np.zeros(self._data.shape[0], dtype=bool)
        self._alive[:n] = True
        self._graph = self._graph_data = self._filter = None
        if n >= self.min_graph_rows:
            cagra = self._cuvs.cagra
            params = cagra.IndexParams(
                metric="inner_product",
                graph_degree=self.graph_degree,
                intermediate_graph_degree=self.intermediate_graph_degree,
            )
            self._graph_data = data
            self._graph = cagra.build(params, data)
            logger.debug("built a CAGRA graph over %d vectors", n)
        self._built, self._changed = n, 0

    def _prefilter(self) -> Any:
        """The bitset of live rows (bit r of word r // 32, 1 = searchable), or None if all are."""
        n = len(self._ids)
        if len(self._rows) == n:
            return None
        if self._filter is None:
            words = np.zeros(math.ceil(n / 32) * 4, dtype=np.uint8)
            # row r -> bit r % 8 of byte r // 8 -> bit r % 32 of little-endian word r // 32
            bits = np.packbits(self._alive[:n], bitorder="little")
            words[: bits.size] = bits
            bitset = self._cuvs.device_ndarray(words.view("<u4"))  # [ceil(n / 32)] uint32
            self._filter = self._cuvs.filters.from_bitset(bitset)
        return self._filter


def make_index(
    dim: int,
    device: str | torch.device = "cpu",
    size_hint: int = 0,
    cagra_threshold: int = CAGRA_THRESHOLD,
) -> VectorIndex:
    """An index for about ``size_hint`` vectors: exact on the CPU (scanning bfloat16 where the
    CPU computes it natively) or below ``cagra_threshold``, CAGRA on CUDA above it (exact, with
    the reason logged, when CAGRA can't run)."""
    device = torch.device(device)
    if device.type == "cpu":
        return ExactIndex(dim, device, scan_dtype=torch.bfloat16 if native_bfloat16() else None)
    if device.type != "cuda" or size_hint < cagra_threshold:
        return ExactIndex(dim, device)
    try:
        return CagraIndex(dim, device)
    except IndexUnavailableError as e:
        logger.warning("exact vector search for %d vectors on %s: %s", size_hint, device, e)
        return ExactIndex(dim, device)


def _load_cuvs(device: torch.device) -> SimpleNamespace:
    """The cuVS pieces CagraIndex uses, or :class:`IndexUnavailableError` saying what is missing."""
    if device.type != "cuda":
        raise IndexUnavailableError(f"CAGRA runs on a CUDA device, not {device}")
    if not torch.cuda.is_available():
        raise IndexUnavailableError("CAGRA needs a CUDA GPU, and torch sees none")
    try:
        from cuvs.neighbors import cagra, filters
        from pylibraft.common import device_ndarray
    except ImportError as e:
        raise IndexUnavailableError(
            f"CAGRA needs cuVS ({e}); install the cuvs package matching torch's CUDA"
            " (cuvs-cu12 or cuvs-cu13)"
        ) from e
    return SimpleNamespace(cagra=cagra, filters=filters, device_ndarray=device_ndarray)


def _check_batch(
    ids: Sequence[int], vectors: torch.Tensor, dim: int, device: torch.device
) -> tuple[list[int], torch.Tensor]:
    """ids as ints, vectors as float32 ``[m, dim]`` on ``device``; a repeated id keeps its last."""
    ids = [int(fid) for fid in ids]
    if vectors.dim() != 2 or vectors.shape[1] != dim or vectors.shape[0] != len(ids):
        raise ValueError(f"vectors must be [{len(ids)}, {dim}], got {tuple(vectors.shape)}")
    vectors = vectors.to(device=device, dtype=torch.float32)
    last = {fid: i for i, fid in enumerate(ids)}
    if len(last) < len(ids):
        keep = sorted(last.values())
        ids = [ids[i] for i in keep]
        vectors = vectors[torch.tensor(keep, device=device)]
    return ids, vectors


def _check_queries(queries: torch.Tensor, dim: int, device: torch.device) -> torch.Tensor:
    if queries.dim() != 2 or queries.shape[1] != dim:
        raise ValueError(f"queries must be [q, {dim}], got {tuple(queries.shape)}")
    return queries.to(device=device, dtype=torch.float32)


def _check_k(k: int) -> int:
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    return k


def _reserve(data: torch.Tensor, rows: int) -> torch.Tensor:
    """``data`` ([capacity, dim]) or a copy with at least ``rows`` rows (capacity doubles)."""
    capacity = data.shape[0]
    if rows <= capacity:
        return data
    while capacity < rows:
        capacity *= 2
    grown = torch.zeros(capacity, data.shape[1], dtype=data.dtype, device=data.device)
    grown[: data.shape[0]] = data
    return grown


def _pairs(
    values: torch.Tensor, rows: torch.Tensor, ids: list[int]
) -> list[list[tuple[int, float]]]:
    """``[q, k]`` scores and rows -> per query ``[(id, score), ...]``."""
    return [
        [(ids[r], v) for r, v in zip(row_list, value_list, strict=True)]
        for row_list, value_list in zip(rows.tolist(), values.tolist(), strict=True)
    ]


def _rows_of(
    ids: Sequence[int], rows: dict[int, int], data: torch.Tensor, dim: int
) -> tuple[list[int], torch.Tensor]:
    """The ``ids`` found in ``rows`` (id -> row of ``data``), in order, and their rows as
    float32 ``[n, dim]`` on the CPU."""
    found = [(fid, row) for fid in ids if (row := rows.get(fid)) is not None]
    if not found:
        return [], torch.zeros(0, dim, dtype=torch.float32)
    at = [row for _, row in found]
    if data.device.type == "cpu":
        # numpy's gather: a torch op here, on the caller's thread, wakes torch's CPU thread
        # pool, whose spinning then slows the caller's SQLite by half (measured: BM25 search
        # 1.3 -> 2.7 ms at 10k facts on 2 cores)
        return [fid for fid, _ in found], torch.from_numpy(data.numpy()[at])
    return [fid for fid, _ in found], data[torch.tensor(at, device=data.device)].float().cpu()


def _host(array: Any) -> np.ndarray:
    """A cuVS output (pylibraft device_ndarray, CuPy array or torch tensor) as numpy."""
    if isinstance(array, torch.Tensor):
        return array.cpu().numpy()
    if hasattr(array, "copy_to_host"):  # pylibraft.common.device_ndarray
        return array.copy_to_host()
    if hasattr(array, "get"):  # cupy.ndarray
        return array.get()
    return np.asarray(array)
