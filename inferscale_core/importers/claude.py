"""Claude (claude.ai) data export: ``conversations.json``, or JSON Lines of the same objects.

A conversation is ``{uuid, name, created_at, chat_messages: [...]}``; a message is
``{uuid, sender: "human" | "assistant", text, content: [{type, text, ...}], created_at}``.
The array form is streamed one conversation at a time; the JSON Lines form holds one
conversation object per line.

Text: the ``text`` of the ``content`` blocks of type ``"text"`` joined by blank lines when there
are any, else the message's ``text``. Other blocks (thinking, tool use/results) are not imported.
Attachments whose text Claude kept (``attachments: [{file_name, extracted_content}]``) follow
it, each as ``[attachment: <file_name>]`` and its text on the next lines, after a blank line;
``files`` (images, PDFs) carry no text and are left out. Messages with no text and no attachment
text are skipped. ``sender`` ``"human"`` becomes speaker ``"user"``; ``"assistant"`` stays;
other senders are kept as written.

Timestamps: ``created_at`` (ISO 8601; Claude writes ``Z``/offsets, so they are aware).
``Turn.source_id`` is the message ``uuid``; ``Conversation.source_id`` the conversation ``uuid``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from inferscale_core.importers._common import (
    Source,
    as_path,
    expect_dict,
    expect_list,
    first_significant_byte,
    iter_json_array,
    iter_nonblank_json_lines,
    optional_id,
    optional_str,
    parse_iso,
    short,
)
from inferscale_core.importers._sniff import Sample, describe_keys
from inferscale_core.types import Conversation, Turn

FORMAT = "claude"
_SPEAKERS = {"human": "user", "assistant": "assistant"}


def check(sample: Sample) -> str | None:
    """``None`` if ``sample`` looks like a Claude export (array or JSON Lines), else why not."""
    head = sample.json
    if head is None:
        return "not JSON (a Claude export starts with '[' or, as JSON Lines, with '{')"
    if head.top == "array":
        if head.empty:
            return "the JSON array is empty"
        keys = head.record_keys()
        if "chat_messages" in keys:
            return None
        if head.problem:
            return head.problem
        return f"the first item has {describe_keys(keys)}, no 'chat_messages'"
    first = sample.first_line_json
    if isinstance(first, dict):
        if "chat_messages" in first:
            return None
        return f"the first line's object has {describe_keys(frozenset(first))}, no 'chat_messages'"
    if sample.first_line_problem:
        return sample.first_line_problem
    if first is not None:
        return "the first line is not a JSON object"
    # the first line is longer than the head: judge by the keys seen so far
    if "chat_messages" in head.record_keys():
        return None
    return head.problem or "no 'chat_messages' key in the first object"


def parse(path: str | os.PathLike[str]) -> Iterator[Conversation]:
    """Stream the conversations of a Claude export (JSON array or JSON Lines)."""
    src = Source(as_path(path), FORMAT)
    if first_significant_byte(src.path) == b"{":
        for lineno, value in iter_nonblank_json_lines(src):
            yield _conversation(src, f"line {lineno}", value)
    else:
        for index, item in iter_json_array(src, "conversation"):
            yield _conversation(src, f"conversation at index {index}", item)


def _conversation(src: Source, where: str, item: object) -> Conversation:
    conv = expect_dict(item, src, where, "the conversation")
    conv_id = optional_id(conv.get("uuid"), src, where, "'uuid'")
    if conv_id is not None:
        where = f"{where} (uuid {short(conv_id, 40)})"
    name = optional_str(conv.get("name"), src, where, "'name'")
    messages = expect_list(conv.get("chat_messages"), src, where, "'chat_messages'")
    turns = [
        turn
        for number, message in enumerate(messages)
        if (turn := _turn(src, f"{where}, message {number}", message)) is not None
    ]
    return Conversation(
        title=name.strip() if name and name.strip() else "Untitled conversation",
        turns=turns,
        source=FORMAT,
        source_id=conv_id,
    )


def _turn(src: Source, where: str, item: object) -> Turn | None:
    message = expect_dict(item, src, where, "the message")
    sender = optional_str(message.get("sender"), src, where, "'sender'")
    if sender is None:
        raise src.error(where, "'sender' is missing")
    parts = [_text(src, where, message), *_attachments(src, where, message)]
    text = "\n\n".join(part for part in parts if part)
    if not text:
        return None
    return Turn(
        speaker=_SPEAKERS.get(sender, sender),
        text=text,
        timestamp=parse_iso(message.get("created_at"), src, where),
        source_id=optional_id(message.get("uuid"), src, where, "'uuid'"),
    )


def _text(src: Source, where: str, message: dict[str, object]) -> str:
    content = message.get("content")
    blocks: list[str] = []
    if content is not None:
        for number, block in enumerate(expect_list(content, src, where, "'content'")):
            block = expect_dict(block, src, where, f"content block {number}")
            if block.get("type") == "text":
                text = optional_str(block.get("text"), src, where, f"'text' of block {number}")
                if text and text.strip():
                    blocks.append(text.strip())
    if blocks:
        return "\n\n".join(blocks)
    text = optional_str(message.get("text"), src, where, "'text'")
    return (text or "").strip()


def _attachments(src: Source, where: str, message: dict[str, object]) -> list[str]:
    """``[attachment: <file_name>]`` and the text of each attachment that has some."""
    attachments = message.get("attachments")
    if attachments is None:
        return []
    parts = []
    for number, item in enumerate(expect_list(attachments, src, where, "'attachments'")):
        what = f"attachment {number}"
        attachment = expect_dict(item, src, where, what)
        text = optional_str(
            attachment.get("extracted_content"), src, where, f"'extracted_content' of {what}"
        )
        if text and text.strip():
            name = optional_str(attachment.get("file_name"), src, where, f"'file_name' of {what}")
            parts.append(f"[attachment: {(name or '').strip() or 'unnamed'}]\n{text.strip()}")
    return parts
