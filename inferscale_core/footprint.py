"""What a profile's memory takes: its facts, the KV entries on disk per model and per stored
dtype, the disk budget, the facts whose encoding waits until they are retrieved, and (with a
live store) the bytes each memory tier holds. One report for ``memory stats`` and the memory
browser (F4).

Reading it scans the KV folders (every entry file's header): run it off the UI's thread.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from inferscale_core.config import AppConfig
from inferscale_core.factlog import FactLog
from inferscale_core.kvstore import KVStore
from inferscale_core.kvstore.entry_file import usage


def footprint(
    factlog: FactLog,
    profile_id: int,
    kv_root: Path,
    config: AppConfig,
    store: KVStore | None = None,
) -> dict[str, Any]:
    """The report (JSON-shaped): ``facts``, ``kv_store_dtype`` and what it writes as, the
    engine's ``kv_cache_dtype``,
    ``disk_bytes``/``disk_free_bytes``, ``kv_disk_budget``, ``deferred_facts`` (by reason),
    ``models`` (one row per model folder under ``kv_root`` with entries: entries, bytes on
    disk, per entry and per token, per stored dtype, the bytes the budget counts and the
    budget) and, with ``store``, ``tiers`` (entries, bytes and budget of each of its tiers)."""
    kv_root.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(kv_root).free
    models = []
    for folder in sorted(p for p in kv_root.iterdir() if p.is_dir()):
        found = usage(folder)
        if not found.entries:
            continue
        recorded = factlog.kv_bytes(folder.name)
        models.append(
            {
                "fingerprint": folder.name,
                "entries": found.entries,
                "disk_bytes": found.file_bytes,
                "tokens": found.tokens,
                "bytes_per_entry": round(found.file_bytes / found.entries),
                "bytes_per_token": round(found.payload / found.tokens) if found.tokens else 0,
                "by_dtype": {
                    scheme: {"entries": n, "disk_bytes": size}
                    for scheme, (n, size) in sorted(found.by_scheme.items())
                },
                "recorded_bytes": recorded,  # what the budget counts (every profile's rows)
                "budget_bytes": config.disk_budget(free, recorded),  # None: no budget
            }
        )
    deferred = factlog.deferred_kv(profile_id)
    report: dict[str, Any] = {
        "facts": len(factlog.active_facts(profile_id)),
        "kv_store_dtype": config.kv_store_dtype,
        "writes_as": config.store_dtype,
        "kv_cache_dtype": config.kv_cache_dtype,  # the engine's cache (fp8: a store of its own)
        "disk_bytes": sum(m["disk_bytes"] for m in models),
        "disk_free_bytes": free,
        "kv_disk_budget": config.kv_disk_budget,
        "deferred_facts": sum(deferred.values()),  # encoded when first retrieved
        "deferred_by_reason": deferred,  # "evicted" (for the budget), "import" (old turns)
        "models": models,
    }
    if store is not None:
        report["tiers"] = {
            name: {"entries": tier.entries, "bytes": tier.bytes, "budget": tier.budget}
            for name, tier in store.stats().tiers.items()
        }
    return report


def size_text(n: float) -> str:
    """``n`` bytes as people read them: ``512 B``, ``1.8 MiB``, ``3.2 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def summary(report: dict[str, Any]) -> str:
    """One line of :func:`footprint`: memories, KV on disk per dtype, budget, tiers, waiting."""
    kinds: dict[str, int] = {}
    for model in report["models"]:
        for scheme, cell in model["by_dtype"].items():
            kinds[scheme] = kinds.get(scheme, 0) + cell["entries"]
    stored = ", ".join(f"{scheme} {n:,}" for scheme, n in sorted(kinds.items())) or "none yet"
    budgets = [m["budget_bytes"] for m in report["models"] if m["budget_bytes"] is not None]
    if report["kv_disk_budget"] == "off":
        budget = "no budget"
    elif budgets:
        budget = f"budget {size_text(max(budgets))}"
    else:
        budget = f"budget {report['kv_disk_budget']}"
    facts = report["facts"]
    parts = [
        f"{facts:,} {'memory' if facts == 1 else 'memories'}",
        f"KV {size_text(report['disk_bytes'])} on disk ({stored}; {budget})",
    ]
    for name, tier in report.get("tiers", {}).items():
        if name != "disk" and tier["entries"]:
            parts.append(f"{name} {tier['entries']:,} in {size_text(tier['bytes'])}")
    if report["deferred_facts"]:
        parts.append(f"{report['deferred_facts']:,} encoded when first asked about")
    return " · ".join(parts)
