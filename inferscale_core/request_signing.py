"""Loads and captures only the server asked for: kv_transfer_params signed with a server key.

``kv_transfer_params`` name which stored entries a request loads and which spans it writes to
the store. In vLLM's OpenAI server a client may put them in a request body; our own server
refuses them, and on top of that the connector can require a signature: with
``kv_connector_extra_config["request_key"]`` set (the serving engine sets a random one per
start, known only to its processes), every request's params must carry
``sig = HMAC-SHA256(key, fingerprint, entries, capture, cache salt)`` or nothing is loaded or
captured. The cache salt is signed too, so signed params cannot be replayed under another
user's salt. Without a key (the in-process app, whose only client is itself) nothing changes.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any

SIG = "sig"


def _message(ours: Mapping[str, Any], cache_salt: str | None) -> bytes:
    body = [ours.get("fingerprint"), ours.get("entries"), ours.get("capture"), cache_salt]
    return json.dumps(body, separators=(",", ":")).encode()


def sign(ours: dict[str, Any], key: bytes, cache_salt: str | None) -> dict[str, Any]:
    """``ours`` (the ``"inferscale"`` part of kv_transfer_params) with its signature."""
    ours[SIG] = hmac.new(key, _message(ours, cache_salt), hashlib.sha256).hexdigest()
    return ours


def signature_error(ours: Mapping[str, Any], key: bytes, cache_salt: str | None) -> str | None:
    """Why ``ours`` is not signed with ``key`` for this salt, or None when it is."""
    given = ours.get(SIG)
    if not isinstance(given, str):
        return "kv_transfer_params are not signed by the server: nothing is loaded or captured"
    expected = hmac.new(key, _message(ours, cache_salt), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(given, expected):
        return "kv_transfer_params carry a wrong signature: nothing is loaded or captured"
    return None
