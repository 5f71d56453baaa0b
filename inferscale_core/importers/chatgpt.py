"""ChatGPT data export: ``conversations.json`` (and the split ``conversations-NNN.json``).

The file is a JSON array of conversations, read one at a time (streaming). Each conversation
stores its messages as a tree in ``mapping`` (``{node_id: {id, message, parent, children}}``);
edits and regenerations create sibling branches. Only the thread the user last saw is imported:
the path from ``current_node`` up through ``parent`` links, reversed.

Kept: ``user`` and ``assistant`` messages (and any other role except ``system`` and ``tool``)
with non-empty text. Text is the ``parts`` of the content joined by newlines: string parts, and
dict parts that carry a ``text`` string; image/audio/asset parts are dropped silently (no
placeholder). Content without ``parts`` (``code`` blocks) contributes its ``text``. Skipped:
messages with ``weight`` 0, messages flagged ``is_visually_hidden_from_conversation`` or
``is_user_system_message`` in ``metadata`` (custom instructions), and assistant messages
addressed to a tool (``recipient`` other than ``"all"``: browsing / code-interpreter calls).

Timestamps: ``message.create_time`` (epoch seconds) as aware UTC datetimes; ``None`` when null.
``Turn.source_id`` is the node id; ``Conversation.source_id`` is ``conversation_id`` (or ``id``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from inferscale_core.importers._common import (
    Source,
    as_path,
    describe_type,
    epoch_to_utc,
    expect_dict,
    expect_list,
    iter_json_array,
    optional_id,
    optional_str,
    short,
)
from inferscale_core.importers._sniff import Sample, describe_keys
from inferscale_core.types import Conversation, Turn

FORMAT = "chatgpt"
_SKIPPED_ROLES = frozenset({"system", "tool"})
_NODE_KEYS = frozenset({"message", "parent", "children"})


def check(sample: Sample) -> str | None:
    """``None`` if ``sample`` looks like a ChatGPT export, else why it does not."""
    head = sample.json
    if head is None or head.top != "array":
        return "not a JSON array (a ChatGPT export starts with '[')"
    if head.empty:
        return "the JSON array is empty"
    if head.record_type not in (None, "object"):
        return f"the array holds {head.record_type}s, not conversation objects"
    keys = head.record_keys()
    if "current_node" in keys or ("mapping" in keys and head.keys_below("mapping.") & _NODE_KEYS):
        return None
    if head.problem:
        return head.problem
    return (
        f"the first item has {describe_keys(keys)}, but a ChatGPT conversation has "
        f"'mapping' (message nodes with parent/children) and 'current_node'"
    )


def parse(path: str | os.PathLike[str]) -> Iterator[Conversation]:
    """Stream the conversations of a ChatGPT ``conversations.json``."""
    src = Source(as_path(path), FORMAT)
    for index, item in iter_json_array(src, "conversation"):
        yield _conversation(src, index, item)


def _conversation(src: Source, index: int, item: object) -> Conversation:
    where = f"conversation at index {index}"
    conv = expect_dict(item, src, where, "the conversation")
    conv_id = optional_id(conv.get("conversation_id"), src, where, "'conversation_id'")
    if conv_id is None:
        conv_id = optional_id(conv.get("id"), src, where, "'id'")
    if conv_id is not None:
        where = f"{where} (id {short(conv_id, 40)})"
    title = optional_str(conv.get("title"), src, where, "'title'")
    mapping = expect_dict(conv.get("mapping"), src, where, "'mapping'")
    current = conv.get("current_node")
    if not isinstance(current, str):
        raise src.error(
            where, f"'current_node' is {describe_type(current)}, expected a node id string"
        )
    turns = [
        turn
        for node_id, node in _thread(src, where, mapping, current)
        if (turn := _turn(src, f"{where}, node {short(node_id, 40)}", node_id, node)) is not None
    ]
    return Conversation(
        title=title.strip() if title and title.strip() else "Untitled conversation",
        turns=turns,
        source=FORMAT,
        source_id=conv_id,
    )


def _thread(
    src: Source, where: str, mapping: dict[str, object], current: str
) -> list[tuple[str, dict[str, object]]]:
    """The nodes from the root down to ``current`` (following ``parent`` links upward)."""
    chain: list[tuple[str, dict[str, object]]] = []
    seen: set[str] = set()
    node_id: str | None = current
    while node_id is not None:
        if node_id in seen:
            raise src.error(where, f"the parent links loop at node {short(node_id, 40)}")
        seen.add(node_id)
        if node_id not in mapping:
            missing = "'current_node'" if node_id == current else "a parent link"
            raise src.error(where, f"{missing} names node {short(node_id, 40)}, not in 'mapping'")
        node_where = f"{where}, node {short(node_id, 40)}"
        node = expect_dict(mapping[node_id], src, node_where, "the node")
        chain.append((node_id, node))
        parent = node.get("parent")
        if parent is not None and not isinstance(parent, str):
            raise src.error(node_where, f"'parent' is {describe_type(parent)}, expected a string")
        node_id = parent
    chain.reverse()
    return chain


def _turn(src: Source, where: str, node_id: str, node: dict[str, object]) -> Turn | None:
    """The turn for one node of the thread, or ``None`` when the node is not shown/kept."""
    message = node.get("message")
    if message is None:
        return None  # the root node carries no message
    message = expect_dict(message, src, where, "'message'")
    author = expect_dict(message.get("author"), src, where, "'author'")
    role = optional_str(author.get("role"), src, where, "'author.role'")
    if role is None:
        raise src.error(where, "'author.role' is missing")
    metadata = message.get("metadata")
    metadata = {} if metadata is None else expect_dict(metadata, src, where, "'metadata'")
    weight = message.get("weight", node.get("weight", 1.0))
    if weight is not None and (isinstance(weight, bool) or not isinstance(weight, int | float)):
        raise src.error(where, f"'weight' is {describe_type(weight)}, expected a number")
    recipient = message.get("recipient")
    if (
        role in _SKIPPED_ROLES
        or weight == 0
        or metadata.get("is_visually_hidden_from_conversation") is True
        or metadata.get("is_user_system_message") is True
        or (role == "assistant" and isinstance(recipient, str) and recipient != "all")
    ):
        return None
    text = _text(src, where, message.get("content"))
    if not text:
        return None
    return Turn(
        speaker=role,
        text=text,
        timestamp=epoch_to_utc(message.get("create_time"), src, where),
        source_id=node_id,
    )


def _text(src: Source, where: str, content: object) -> str:
    """The visible text of a message's ``content`` (stripped; may be empty)."""
    if content is None:
        return ""
    content = expect_dict(content, src, where, "'content'")
    parts = content.get("parts")
    if parts is None:
        text = optional_str(content.get("text"), src, where, "'content.text'")
        return (text or "").strip()
    texts: list[str] = []
    for number, part in enumerate(expect_list(parts, src, where, "'content.parts'")):
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, dict):
            text = optional_str(part.get("text"), src, where, f"'text' of part {number}")
            if text is not None:
                texts.append(text)
            # other dict parts (image_asset_pointer, audio, …) are dropped without a note
        elif part is not None:
            raise src.error(
                where, f"content part {number} is {describe_type(part)}, expected text or an object"
            )
    return "\n".join(text for text in texts if text.strip()).strip()
