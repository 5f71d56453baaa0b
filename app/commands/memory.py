"""``inferscale-assistant memory list|search|forget|export|stats|prune``: the memory without
the UI.

Works on the fact log at ``data_dir()/memory.db`` and the config's profile (``--profile``
overrides it); no engine is started. ``search`` runs the chat's own retrieval (MiniLM and the
fact log's BM25 index, fused as a reply's memories are: ``wiring.make_retriever``) and shows
each hit with its score, date, validity and the turn it came from. ``forget`` removes a fact
everywhere the TUI's memory browser does: the log (text, embeddings, KV rows, in one
transaction) and the KV tensor files. ``prune --model`` drops another model's KV entries
(rows, then files); facts are never touched.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
from datetime import UTC, date, datetime, time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from app.user_config import load_config
from inferscale_core import paths
from inferscale_core.desk import fact_json
from inferscale_core.factlog import FactLog
from inferscale_core.types import Fact

if TYPE_CHECKING:
    from inferscale_core.config import AppConfig
    from inferscale_core.types import Hit, Turn

FORGET_CAUSE = "forgotten with `inferscale-assistant memory forget`"
EXCERPT_CHARS = 80  # of a hit's source turn
SEARCH_MODES = ("hybrid", "dense", "keyword")  # inferscale_core.retriever.MODES, without torch
FINGERPRINT = re.compile(r"[0-9a-f]{16}")  # inferscale_core.fingerprint.model_fingerprint


def _memories(n: int) -> str:
    """``n`` memories, in words: "1 memory", "3 memories"."""
    return f"{n} memory" if n == 1 else f"{n} memories"


def _entries(n: int) -> str:
    """``n`` KV entries, in words: "1 KV entry", "0 KV entries"."""
    return f"{n} KV entry" if n == 1 else f"{n} KV entries"


def _profile(args: argparse.Namespace, console: Console) -> str | None:
    if args.profile:
        return args.profile
    config = load_config(console)
    return None if config is None else config.profile


def facts_table(facts: list[Fact], title: str) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("#", justify="right")
    table.add_column("about")
    table.add_column("status")
    table.add_column("memory")
    for fact in facts:
        table.add_row(
            str(fact.id),
            fact.refers_to.isoformat() if fact.refers_to else "",
            fact.status,
            escape(fact.text or "(forgotten)"),
        )
    return table


def run_list(log: FactLog, pid: int, args: argparse.Namespace, console: Console) -> int:
    statuses = ("active", "superseded", "forgotten") if args.all else ("active",)
    facts = log.search_facts(pid, "", statuses, limit=args.limit)
    if args.json:
        print(json.dumps([fact_json(f) for f in facts], indent=2))
        return 0
    Console().print(facts_table(facts, f"{_memories(len(facts))} (newest first)"))
    return 0


def end_of_day(day: date) -> datetime:
    """The last microsecond of ``day`` on this machine's clock (aware)."""
    return datetime.combine(day, time.max).astimezone()


def _excerpt(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= EXCERPT_CHARS else flat[: EXCERPT_CHARS - 1].rstrip() + "…"


def _source_json(source: tuple[int, str, Turn] | None, turn_id: int) -> dict[str, Any] | None:
    if source is None:  # its conversation was deleted
        return None
    conversation_id, title, turn = source
    return {
        "turn_id": turn_id,
        "conversation_id": conversation_id,
        "conversation": title,
        "speaker": turn.speaker,
        "timestamp": turn.timestamp.isoformat() if turn.timestamp else None,
        "excerpt": _excerpt(turn.text),
    }


def hits_json(log: FactLog, hits: list[Hit]) -> list[dict[str, Any]]:
    """What ``memory search --json`` prints: per hit, best first, its rank and score, the fact
    (id, text, date, status, what it replaced and what replaced it) and its first source turn
    (None: added by hand, or its conversation deleted)."""
    facts = [hit.fact for hit in hits]
    successors = log.successors([f.id for f in facts])
    sources = log.turn_sources(f.source_turn_ids[0] for f in facts if f.source_turn_ids)
    found = []
    for hit in hits:
        fact = hit.fact
        first = fact.source_turn_ids[0] if fact.source_turn_ids else None
        found.append(
            {
                "rank": hit.rank,
                "score": hit.score,
                **fact_json(fact),
                "superseded_by": successors.get(fact.id),
                "source": None if first is None else _source_json(sources.get(first), first),
            }
        )
    return found


def _validity(hit: dict[str, Any]) -> str:
    if hit["valid_until"] is not None:
        return f"true until {hit['valid_until']}, replaced by #{hit['ended_by']}"
    if hit["superseded_by"] is not None:
        return f"{hit['status']}, superseded by #{hit['superseded_by']}"
    if hit["supersedes"] is not None:
        return f"{hit['status']}, replaces #{hit['supersedes']}"
    return hit["status"]


def _source_cell(source: dict[str, Any] | None) -> str:
    if source is None:
        return "[dim](no source turn)[/dim]"
    when = f" · {source['timestamp'][:16].replace('T', ' ')}" if source["timestamp"] else ""
    where = source["conversation"] or f"conversation {source['conversation_id']}"
    return escape(f"{where} · {source['speaker']}{when}\n“{source['excerpt']}”")


def run_search(log: FactLog, pid: int, args: argparse.Namespace, console: Console) -> int:
    """The product's retrieval for QUERY: what the chat would inject, best first."""
    from inferscale_core.wiring import make_retriever

    k = args.k
    if k is None:
        config = load_config(console)
        if config is None:
            return 2
        if config.k == 0:
            console.print("[red]error:[/red] k = 0 in the settings (no retrieval): pass --k N")
            return 2
        k = config.k
    as_of = None if args.at is None else end_of_day(args.at)
    hits = make_retriever(log).search(pid, args.query, k, "best_first", args.mode, as_of)
    found = hits_json(log, hits)
    if args.json:
        print(json.dumps(found, indent=2, ensure_ascii=False))
        return 0
    when = f", as of {args.at.isoformat()}" if args.at else ""
    table = Table(
        title=f"{_memories(len(found))} for {escape(repr(args.query))} ({args.mode}, k={k}{when})",
        title_justify="left",
    )
    for name in ("rank", "score", "#", "about", "validity", "memory", "from"):
        table.add_column(name, justify="right" if name in ("rank", "score", "#") else "left")
    for hit in found:
        table.add_row(
            str(hit["rank"]),
            f"{hit['score']:.3f}",
            str(hit["id"]),
            hit["refers_to"] or "",
            _validity(hit),
            escape(hit["text"]),
            _source_cell(hit["source"]),
        )
    Console().print(table)
    return 0


def run_forget(log: FactLog, pid: int, args: argparse.Namespace, console: Console) -> int:
    facts = []
    for fact_id in args.ids:
        fact = log.get_fact(fact_id)
        if fact is None or fact.profile_id != pid:
            console.print(f"[red]error:[/red] no memory #{fact_id} in this profile")
            return 1
        facts.append(fact)
    active = [f for f in facts if f.status != "forgotten"]
    if not active:
        console.print("nothing to forget: already forgotten")
        return 0
    Console().print(facts_table(active, "to forget"))
    refused = _confirm(console, args.yes, "Forget these memories for good?", "nothing forgotten")
    if refused is not None:
        return refused
    from inferscale_core.desk_socket import RemoteDesk
    from inferscale_core.kvstore import KVStore

    # A running assistant forgets through its desk: its index and memory tiers drop the fact
    # too. Every model's entries are then deleted here (the desk deletes its model's).
    resident = RemoteDesk.connect(paths.memory_db(), args.profile_name)
    stores: dict[str, KVStore] = {}
    for fact in active:
        entries = log.kv_keys_by_model(fact.id)
        if resident is not None:
            resident.forget(fact.id, FORGET_CAUSE)  # its log, index, tiers and KV
        else:
            log.forget_fact(fact.id, FORGET_CAUSE)
        for fingerprint, location in entries:
            if fingerprint not in stores:
                stores[fingerprint] = KVStore(paths.kv_dir() / fingerprint)
            stores[fingerprint].delete(location)
        through = " through the running assistant" if resident is not None else ""
        console.print(f"forgot #{fact.id}{through} ({_entries(len(entries))} deleted)")
    if resident is not None:
        resident.close()
    return 0


def run_export(log: FactLog, pid: int, args: argparse.Namespace, console: Console) -> int:
    data = {
        "profile": args.profile_name,
        "exported_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "facts": [fact_json(f) for f in sorted(log.active_facts(pid), key=lambda f: f.id)],
    }
    text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    if args.output is None:
        sys.stdout.write(text)
        return 0
    out = Path(args.output).expanduser()
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # memories are private
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    console.print(f"wrote {_memories(len(data['facts']))} to {out}")
    return 0


def run_stats(log: FactLog, pid: int, args: argparse.Namespace, console: Console) -> int:
    """How many memories, and what their KV takes on disk: per model, per stored scheme."""
    from inferscale_core.footprint import footprint, size_text

    config = load_config(console)
    if config is None:
        return 2
    report = {"profile": args.profile_name, **footprint(log, pid, paths.kv_dir(), config)}
    fingerprint, _ = _current_fingerprint(config)
    report["model_in_use"] = fingerprint
    # after a model switch: how far its re-encode is (the rest goes in as text until then)
    report["encoded_for_model_in_use"] = (
        None if fingerprint is None else log.facts_encoded_for(pid, fingerprint)
    )
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    out = Console()
    out.print(
        f"{_memories(report['facts'])} in profile {escape(report['profile'])};"
        f" KV entries kept as {config.store_dtype} (kv_store_dtype = {config.kv_store_dtype})"
        + ("; the engine's KV cache is fp8" if config.kv_cache_dtype == "fp8" else "")
    )
    table = Table(title="KV entries on disk (all profiles), per model", title_justify="left")
    for name in ("model", "entries", "on disk", "per entry", "per token", "stored as", "budget"):
        table.add_column(name, justify="right" if name != "model" else "left")
    for m in report["models"]:
        kinds = ", ".join(f"{scheme} {d['entries']}" for scheme, d in m["by_dtype"].items())
        table.add_row(
            m["fingerprint"][:16],
            str(m["entries"]),
            size_text(m["disk_bytes"]),
            size_text(m["bytes_per_entry"]),
            size_text(m["bytes_per_token"]),
            kinds,
            "off" if m["budget_bytes"] is None else size_text(m["budget_bytes"]),
        )
    out.print(table)
    out.print(
        f"{size_text(report['disk_bytes'])} in all; {size_text(report['disk_free_bytes'])} free"
    )
    encoded = report["encoded_for_model_in_use"]
    if encoded is not None:
        left = report["facts"] - encoded
        out.print(
            f"the model in use ({fingerprint[:16]}) has KV for {encoded} of {report['facts']}"
            " memories"
            + (
                f"; {left} are encoded in the background while the assistant runs (given as"
                " text until then)"
                if left > 0
                else ""
            )
        )
    deferred = report["deferred_by_reason"]
    why = ", ".join(f"{n} {reason}" for reason, n in sorted(deferred.items()))
    out.print(
        f"kv_disk_budget = {config.kv_disk_budget}; {_memories(report['deferred_facts'])} encoded"
        f" when first retrieved" + (f" ({why})" if why else "")
    )
    return 0


def _current_fingerprint(config: AppConfig) -> tuple[str | None, str]:
    """The fingerprint of the model in use (the config's), or None and why it is not known."""
    from inferscale_core.fingerprint import model_fingerprint
    from inferscale_core.model_files import ModelSetupError, model_weights, prepared_model

    try:
        folder = prepared_model(config.model)
        on_load = model_weights(config.model, config.weights).on_load
    except ModelSetupError as exc:
        return None, str(exc).split("\n")[0]
    if folder is None:
        return None, "the configured model is not prepared yet (`inferscale-assistant doctor`)"
    return model_fingerprint(folder, config.kv_cache_dtype, on_load), ""


def _prune_targets(text: str) -> list[str]:
    """The store fingerprints ``--model`` names: a fingerprint as it is; a model (folder, GGUF
    or added name) as its fingerprints, one per KV cache dtype and weights as stored or fp8 on
    load (each has a store of its own).
    Raises ModelSetupError for a name that is neither."""
    from inferscale_core.config import KV_CACHE_DTYPES
    from inferscale_core.fingerprint import model_fingerprint
    from inferscale_core.model_files import ModelSetupError, prepared_model

    if FINGERPRINT.fullmatch(text) or (
        text == Path(text).name and (paths.kv_dir() / text).is_dir()
    ):
        return [text]
    folder = prepared_model(text)
    if folder is None:  # a GGUF never dequantized has never run: it has no entries
        raise ModelSetupError(f"{text!r} was never prepared, so it has no KV entries")
    return [
        model_fingerprint(folder, dtype, on_load)
        for dtype in KV_CACHE_DTYPES
        for on_load in (None, "fp8")  # weights as stored, or fp8 on load (weights_plan.py)
    ]


def run_prune(log: FactLog, pid: int, args: argparse.Namespace, console: Console) -> int:
    """Drop another model's KV entries: rows (one transaction), then files. Facts stay."""
    from inferscale_core.footprint import size_text
    from inferscale_core.kvstore.entry_file import usage
    from inferscale_core.model_files import ModelSetupError

    config = load_config(console)
    if config is None:
        return 2
    try:
        targets = _prune_targets(args.model)
    except ModelSetupError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc).splitlines()[0])}")
        return 2
    current, why = _current_fingerprint(config)
    if current is None:
        console.print(f"[red]error:[/red] cannot tell which model is in use: {escape(why)}")
        return 2
    if current in targets:
        console.print(
            f"[red]error:[/red] {escape(args.model)} is the model in use ({current}): its KV"
            " entries serve every reply. Change `model` in the settings first."
        )
        return 2
    plan = []  # (fingerprint, files, file bytes, rows)
    for fingerprint in targets:
        folder = paths.kv_dir() / fingerprint
        found = usage(folder) if folder.is_dir() else None
        rows, _ = log.kv_rows(fingerprint)
        if found is not None and found.entries or rows:
            plan.append(
                (fingerprint, found.entries if found else 0, found.file_bytes if found else 0, rows)
            )
    if not plan:
        stores = sorted(
            p.name for p in paths.kv_dir().iterdir() if p.is_dir() and p.name != current
        )
        others = ", ".join(stores) or "none"
        console.print(
            f"no KV entries for {escape(args.model)} ({', '.join(targets)}): nothing to prune."
            f" Stores of other models: {others} (in use: {current})"
        )
        return 0
    table = Table(title="KV entries to drop (facts stay)", title_justify="left")
    for name in ("model", "entries", "on disk", "recorded rows"):
        table.add_column(name, justify="left" if name == "model" else "right")
    for fingerprint, files, nbytes, rows in plan:
        table.add_row(fingerprint, str(files), size_text(nbytes), str(rows))
    Console().print(table)
    if args.dry_run:
        console.print("dry run: nothing deleted")
        return 0
    refused = _confirm(
        console, args.yes, "Delete these KV entries? They are rebuilt if needed.", "nothing deleted"
    )
    if refused is not None:
        return refused
    from inferscale_core.kvstore import KVStore

    for fingerprint, _, _, _ in plan:
        rows = len(log.drop_model_kv(fingerprint))  # rows first: a crash leaves only files
        folder = paths.kv_dir() / fingerprint
        files, freed = 0, 0
        if folder.is_dir():
            store = KVStore(folder)
            for key in list(store.keys()):  # noqa: SIM118 - a KVStore, not a dict
                size = store.path(key).stat().st_size
                if store.delete(key):
                    files, freed = files + 1, freed + size
            with contextlib.suppress(OSError):  # left if something else is in it
                folder.rmdir()
        console.print(
            f"pruned {fingerprint}: {_entries(files)} deleted, {size_text(freed)} freed"
            f" ({rows} recorded keys dropped)"
        )
    return 0


def _run(args: argparse.Namespace, console: Console) -> int:
    profile = _profile(args, console)
    if profile is None:
        return 2
    args.profile_name = profile
    with FactLog.open(paths.memory_db()) as log:
        return args.action(log, log.profile(profile), args, console)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"k must be a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"k must be a whole number >= 1, got {text!r}")
    return value


def _day(text: str) -> date:
    try:
        return datetime.strptime(text, "%Y-%m-%d").date()
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a date YYYY-MM-DD: {text!r}") from None


def register(sub: argparse._SubParsersAction) -> None:
    memory = sub.add_parser(
        "memory",
        help="list, search, forget, export memories, prune KV (no engine needed)",
        description="The long-term memory, without the UI. Forgetting removes a memory from"
        " the log, its search embedding and every stored KV tensor; the audit keeps a record.",
    )
    memory.add_argument("--profile", help="whose memory (default: the config's profile)")
    actions = memory.add_subparsers(dest="memory_command", metavar="ACTION", required=True)

    def common(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--all", action="store_true", help="include forgotten and replaced")
        parser.add_argument("--limit", type=int, default=100, help="at most this many (100)")
        parser.add_argument("--json", action="store_true", help="print JSON instead of a table")

    lst = actions.add_parser("list", help="the newest memories", description="List memories.")
    common(lst)
    lst.set_defaults(func=_run, action=run_list)
    search = actions.add_parser(
        "search",
        help="what the assistant would retrieve for QUERY",
        description="Run the chat's own retrieval for QUERY (no engine: MiniLM and the keyword"
        " index only) and show the memories a reply would get, best first: rank, score, the"
        " day the memory is about, its validity, its id and text, and the turn it came from."
        " Scores: hybrid = the fused score over the best possible (1.0 = first in every"
        " ranking), dense = cosine similarity, keyword = BM25.",
    )
    search.add_argument("query", metavar="QUERY", help="a question, as you would ask it")
    search.add_argument(
        "--k", type=_positive, metavar="N", help="how many memories (default: k in the settings)"
    )
    search.add_argument(
        "--mode",
        choices=SEARCH_MODES,
        default="hybrid",
        help="the ranking: hybrid (the chat's: dense and keyword fused), dense (MiniLM only)"
        " or keyword (BM25 over the fact log only); default hybrid",
    )
    search.add_argument(
        "--at",
        type=_day,
        metavar="YYYY-MM-DD",
        help="search the memory as it was at the end of that day (this machine's time zone):"
        " only memories created by then. Today that means the active memories created by"
        " then: one replaced or forgotten since is not searched",
    )
    search.add_argument("--json", action="store_true", help="print JSON instead of a table")
    search.add_argument(
        "--profile", default=argparse.SUPPRESS, help="whose memory (default: the config's)"
    )
    search.set_defaults(func=_run, action=run_search)
    forget = actions.add_parser(
        "forget",
        help="forget memories by id (asks first)",
        description="Forget memories for good: text, embedding and KV tensors are deleted and"
        " the memory is never injected again. Ids are shown by `memory list`.",
    )
    forget.add_argument("ids", type=int, nargs="+", metavar="ID", help="memory id(s)")
    forget.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    forget.set_defaults(func=_run, action=run_forget)
    export = actions.add_parser(
        "export",
        help="the active memories as JSON",
        description="Write the active memories as JSON: {profile, exported_at, facts: [{id,"
        " text, refers_to, created_at, source_turn_ids, supersedes}]}.",
    )
    export.add_argument("-o", "--output", help="write to this file (mode 600) instead of stdout")
    export.set_defaults(func=_run, action=run_export)
    stats = actions.add_parser(
        "stats",
        help="how many memories, and the disk their KV takes",
        description="The profile's memories, and the KV entries on disk per model: entries,"
        " bytes, bytes per entry and per token, how many are stored in each dtype (model,"
        " fp8, int4; `kv_store_dtype` in the settings says which new ones get), the disk"
        " budget (`kv_disk_budget`) and how many memories wait to be encoded until first"
        " retrieved (their KV dropped for the budget, or old imported turns).",
    )
    stats.add_argument("--json", action="store_true", help="print JSON instead of a table")
    stats.set_defaults(func=_run, action=run_stats)
    prune = actions.add_parser(
        "prune",
        help="drop another model's KV entries (asks first)",
        description="Delete the stored KV entries of a model you no longer use: their files"
        " under the data folder's kv/<fingerprint>/ and their rows in the fact log. Memories"
        " are not touched (a model's entries are rebuilt from their text when it is used"
        " again). The model in use is refused. `memory stats` lists the models' fingerprints.",
    )
    prune.add_argument(
        "--model",
        required=True,
        metavar="NAME_OR_FINGERPRINT",
        help="a fingerprint (as `memory stats` shows it), or a model folder, .gguf or added name",
    )
    prune.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    prune.add_argument("--dry-run", action="store_true", help="show what would go, delete nothing")
    prune.set_defaults(func=_run, action=run_prune)


def _confirm(console: Console, yes: bool, question: str, declined: str) -> int | None:
    """None to go on (``--yes``, or "y" typed at ``question``); else the exit code: 2 when
    no terminal can answer, 1 when the user said no (``declined`` is printed)."""
    if yes:
        return None
    if not sys.stdin.isatty():
        console.print("[red]error:[/red] not a terminal: pass --yes to confirm")
        return 2
    answer = console.input(f"{question} [y/N] ")
    if answer.strip().lower() not in ("y", "yes"):
        console.print(declined)
        return 1
    return None
