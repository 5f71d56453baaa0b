"""``inferscale-assistant serve`` and ``users``: the assistant as an OpenAI-compatible server.

``serve`` runs vLLM's multi-process async engine with the connector, and an HTTP API on
uvicorn (``app/serve/server.py``): each request is one user's, answered from that user's
memory and logged to it. ``users add NAME`` makes a user and prints their API token once.

The server keeps its own data apart from the desktop app's: ``<data>/serve/`` holds
``memory.db`` (one profile per user), ``users.db`` (token hashes), ``kv/`` (the KV store) and
``inbox/<user>/`` (imported exports, and quarantined ones with their reasons).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from inferscale_core import paths

DEFAULT_PORT = 8000


def serve_dir(args: argparse.Namespace) -> Path:
    """The server's folder and its ``kv/`` and ``inbox/``, each made (or made again) 0700."""
    folder = Path(args.data_dir) if args.data_dir else paths.data_dir() / "serve"
    for path in (folder, folder / "kv", folder / "inbox"):
        paths.private_dir(path)
        os.chmod(path, 0o700)  # also a folder an older version made 0755
    return folder


def archive_uploads(inbox: Path, name: str, profile: str) -> Path | None:
    """Move a removed user's uploads (``inbox/<name>/``) to ``inbox/.removed/<profile>/``, out
    of reach of a new user of that name (no user name starts with a dot); None if none."""
    uploads = inbox / name
    if not uploads.is_dir():
        return None
    to = paths.private_dir(inbox / ".removed") / profile.replace(":", "-")
    uploads.rename(to)
    return to


def run_users(args: argparse.Namespace, console: Console) -> int:
    from app.serve.users import UserError, Users

    folder = serve_dir(args)
    users = Users(folder / "users.db")
    try:
        if args.action == "add":
            token = users.add(args.name)
        elif args.action == "token":
            token = users.new_token(args.name)
        elif args.action == "remove":
            archive = users.remove(args.name)
            uploads = archive_uploads(folder / "inbox", args.name, archive)
            console.print(
                f"removed {escape(args.name)}: their token no longer works; their memory is"
                f" archived (fact-log profile {escape(archive)}"
                + (f", uploads in {escape(str(uploads))}" if uploads else "")
                + "); a new user of this name starts empty"
            )
            return 0
        else:
            rows = users.names()
            for name, created in rows:
                console.print(f"{escape(name)}  (since {created[:10]})")
            if not rows:
                console.print("no users yet: `inferscale-assistant users add NAME`")
            return 0
    except UserError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        return 1
    finally:
        users.close()
    # The token alone on stdout (scripts read it); what to do with it on stderr.
    print(token)
    Console(stderr=True).print(
        f"the API token of {escape(args.name)}: shown once, keep it secret. Clients send it as"
        " 'Authorization: Bearer <token>' (the OpenAI client's api_key)."
    )
    return 0


def run_serve(args: argparse.Namespace, console: Console) -> int:
    from app.serve.launch import ServeRecipe, serve
    from app.serve.users import Users
    from app.startup import quiet_engine_logs
    from app.user_config import load_config
    from inferscale_core.model_files import resolve_model

    # What the server and its engine processes create is theirs alone (folders 0700, files
    # 0600), whichever code creates it: users' memories, KV tensors, uploads, sockets.
    os.umask(0o077)
    config = load_config(console)
    if config is None:
        return 1
    if args.api_processes < 1:
        console.print("[red]error:[/red] --api-processes must be at least 1")
        return 2
    if args.ray is not None and (args.ray < 1 or args.api_processes > 1):
        console.print(
            "[red]error:[/red] --ray N needs N >= 1 replicas, and no --api-processes (each"
            " replica is one process over its own engine)"
        )
        return 2
    if args.ray is not None and not _has_ray():
        console.print(
            "[red]error:[/red] --ray needs Ray Serve, an optional extra: pip install"
            " 'inferscale-assistant[ray]'"
        )
        return 1
    # Before the engine: a bad or unsupported model is one line, a GGUF's dequantizing shown.
    resolve_model(config.model, progress=True, weights=config.weights)
    folder = serve_dir(args)
    users = Users(folder / "users.db")
    if not users.names():
        console.print(
            "[yellow]no users yet:[/yellow] make one with `inferscale-assistant users add NAME`"
            " (it prints the user's API token); requests without a valid token get 401"
        )
    users.close()
    if not args.verbose:
        quiet_engine_logs()
    options = {"max_model_len": args.max_model_len} if args.max_model_len else {}
    recipe = ServeRecipe(
        config, folder, options, model_name=args.served_model_name, verbose=args.verbose
    )
    processes = args.api_processes
    if args.ray is not None:
        what = f"starting Ray Serve: {args.ray} replicas, a vLLM engine each…"
    else:
        what = "starting vLLM (engine and workers in their own processes" + (
            f", {processes} API processes)…" if processes > 1 else ")…"
        )
    status = console.status(what)
    status.start()

    def ready(name: str) -> None:
        status.stop()
        console.print(
            f"serving [bold]{escape(name)}[/bold] on http://{args.host}:{args.port}/v1"
            " (OpenAI-compatible; Ctrl+C stops)"
        )

    try:
        if args.ray is not None:
            from app.serve.ray_app import RaySettings, serve_ray

            settings = RaySettings(
                replicas=args.ray,
                desks=args.desks_per_replica,
                address=args.ray_address,
                gpus_per_replica=_gpu_share(args.ray),
            )
            serve_ray(recipe, args.host, args.port, settings, on_ready=ready)
        else:
            serve(recipe, args.host, args.port, processes, on_ready=ready)
    finally:
        status.stop()
    return 0


def _has_ray() -> bool:
    import importlib.util

    return importlib.util.find_spec("ray") is not None


def _gpu_share(replicas: int) -> float:
    """Each replica's share of this host's GPUs in Ray's accounting (0 on a CPU host)."""
    from inferscale_core.weights_plan import engine_device

    if engine_device() != "cuda":
        return 0.0
    import torch

    return torch.cuda.device_count() / replicas


def register(sub: argparse._SubParsersAction) -> None:
    serve = sub.add_parser(
        "serve",
        help="serve the assistant to several users: an OpenAI-compatible HTTP API",
        description="Serve the assistant over HTTP: OpenAI's /v1/chat/completions (streaming"
        " too) and /v1/models, and a memory API per user (/v1/memories). Each request is a"
        " user's, identified by their API token: it is answered from that user's memory (KV"
        " injection) and logged to it. vLLM runs in its multi-process mode, many requests in"
        " flight. Make users first: `inferscale-assistant users add NAME`. Put it behind a"
        " reverse proxy with TLS to reach it from other machines (docs/SERVING.md).",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"({DEFAULT_PORT})")
    serve.add_argument(
        "--served-model-name", help="the model's name in the API (default: its folder's name)"
    )
    serve.add_argument("--max-model-len", type=int, help="tokens of context (default: 8192)")
    serve.add_argument(
        "--api-processes",
        type=int,
        default=1,
        metavar="N",
        help="API processes over one vLLM engine (1). Each serves the users a hash of their"
        " name gives it, behind one listener; more than one when many users keep one"
        " process's CPU busy (retrieval, composition, streaming): 4 on a GPU server",
    )
    serve.add_argument(
        "--ray",
        type=int,
        metavar="N",
        help="serve on Ray Serve with N replicas, a vLLM engine each, over one data folder:"
        " each user's requests go to the replica that holds their memory (needs the [ray]"
        " extra; docs/SERVING.md)",
    )
    serve.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="with --ray: join this Ray cluster (e.g. 'auto', or '<head>:6379') instead"
        " of starting one on this host",
    )
    serve.add_argument(
        "--desks-per-replica",
        type=int,
        default=64,
        metavar="M",
        help="with --ray: users a replica keeps loaded; past M the least recently used is"
        " unloaded (its memory closed, its lease given up) (64)",
    )
    _data_dir(serve)
    serve.set_defaults(func=run_serve)

    users = sub.add_parser(
        "users",
        help="the server's users: add one (prints their API token), list, new token, remove",
        description="Manage who may use `inferscale-assistant serve`. A token is printed once"
        " (only its hash is stored). Removing a user revokes their token; their memory stays.",
    )
    actions = users.add_subparsers(dest="action", metavar="ACTION")
    _data_dir(actions.add_parser("list", help="the users"), argparse.SUPPRESS)
    for action, text in (
        ("add", "make a user and print their API token"),
        ("token", "replace a user's token (the old one stops working) and print it"),
        ("remove", "revoke a user's access"),
    ):
        parser = actions.add_parser(action, help=text)
        parser.add_argument("name", help="the user's name")
        _data_dir(parser, argparse.SUPPRESS)
    _data_dir(users)
    users.set_defaults(func=run_users, action="list")


def _data_dir(parser: argparse.ArgumentParser, default: str | None = None) -> None:
    parser.add_argument(
        "--data-dir",
        default=default,
        help="the server's folder: memory.db, users.db, kv/, inbox/ (default: <data>/serve)",
    )
