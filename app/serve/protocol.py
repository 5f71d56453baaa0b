"""What the server accepts and returns: OpenAI's chat completions shapes, and the memory API.

Requests are validated strictly (``extra="forbid"``): an unknown field is a 400 naming it, not
something silently ignored. Two fields vLLM's own server would pass through are refused with
their own message: ``kv_transfer_params`` and ``cache_salt`` decide which stored KV a request
loads and which prefix-cache blocks it may share, so only the server sets them (from the
user's own retrieval and secret).

Beyond OpenAI's shapes a completion carries ``memories``: the user's facts that went into it,
``[{"id", "how", "score"}]`` (``how``: "injected", "recomputed", "text" or "text
(re-encoding)": its KV was dropped for the disk budget, so it went in as text and is encoded
again in the background; ``inferscale_core.session.HOWS``).
"""

from __future__ import annotations

import time
import uuid
from datetime import date
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

SERVER_ONLY = ("kv_transfer_params", "cache_salt")


def check_text(value: str) -> str:
    """``value``, if it is text the server can store, search and tokenize: no NUL, and no lone
    surrogate (JSON's ``"\\ud800"`` decodes to one; UTF-8, SQLite and the tokenizer refuse it).
    Raises ValueError saying which."""
    if "\x00" in value:
        raise ValueError("contains a NUL character (\\u0000); send text without it")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            "contains a lone surrogate (such as \\ud800), which is not Unicode text"
        ) from None
    return value


def _checked(value: Any) -> Any:
    return check_text(value) if isinstance(value, str) else value


# Checked before pydantic's own str checks, which refuse a lone surrogate with a riddle
# ("unable to parse raw data as a unicode string") where a field has a length limit.
Text = Annotated[str, BeforeValidator(_checked)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextPart(Strict):
    type: Literal["text"]
    text: Text


class Message(Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: Text | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_content(cls, content: Any) -> Any:
        """Checked before the union is: its error then names the content, not a branch."""
        texts = [content] if isinstance(content, str) else []
        if isinstance(content, list):
            texts = [p["text"] for p in content if isinstance(p, dict) and "text" in p]
        for text in texts:
            if isinstance(text, str):
                check_text(text)
        return content

    @property
    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(Strict):
    include_usage: bool = False


class MemoryOptions(Strict):
    """An extension of ours (``"memory": {...}``): how this request uses the user's memory.
    It chooses how many of the user's own facts and how they go in, never which entries."""

    mode: Literal["inject", "prompt", "none"] = "inject"  # prompt: the facts as text
    k: int | None = Field(default=None, ge=0, le=200)  # None: the server's setting


class ChatRequest(Strict):
    model: Text
    messages: list[Message] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    # vLLM's OpenAI server's extension (the openai client sends it in extra_body): the reply's
    # least length; end-of-text and the loop guard wait for it.
    min_tokens: int | None = Field(default=None, ge=0)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: Literal[1] = 1
    # OpenAI's "store": False answers without logging the exchange to the user's memory.
    store: bool = True
    user: Text | None = None  # accepted (OpenAI clients send it); the token decides the user
    memory: MemoryOptions = Field(default_factory=MemoryOptions)

    @model_validator(mode="before")
    @classmethod
    def _server_only(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name in SERVER_ONLY:
                if name in data:
                    raise ValueError(
                        f"{name} is set by the server from your own memory; a client may not"
                        " send it"
                    )
        return data

    def question_and_history(self) -> tuple[str, list[tuple[str, str]]]:
        """The last user message, and the turns before it as ``(role, text)``.

        Raises ValueError when the last message is not the user's, or for a system message:
        the server's system prompt is part of the stored memory's KV, so it cannot change
        per request."""
        if any(m.role in ("system", "developer") for m in self.messages):
            raise ValueError(
                "system messages are not supported: the server's system prompt is part of the"
                " stored memory; put instructions in a user message"
            )
        *before, last = self.messages
        if last.role != "user":
            raise ValueError("the last message must be the user's")
        return last.text, [(m.role, m.text) for m in before]

    @property
    def reply_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class NewMemory(Strict):
    text: Text = Field(min_length=1, max_length=4000)
    refers_to: date | None = None  # the date the fact is about


class MemorySearch(Strict):
    query: Text = Field(min_length=1, max_length=4000)
    k: int | None = Field(default=None, ge=1, le=200)  # None: the server's k, as a chat uses


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion(
    ident: str,
    model: str,
    text: str,
    finish_reason: str | None,
    usage_: dict[str, int],
    memories: list[dict[str, Any]],
) -> dict[str, Any]:
    """A ``chat.completion`` object."""
    return {
        "id": ident,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish_reason,
                "logprobs": None,
            }
        ],
        "usage": usage_,
        "memories": memories,
    }


def chunk(
    ident: str,
    model: str,
    delta: dict[str, Any],
    finish_reason: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A ``chat.completion.chunk`` object (``extra``: ``usage``, ``memories`` on the last)."""
    choices = [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}]
    return {
        "id": ident,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        **extra,
    }


def error(message: str, kind: str = "invalid_request_error", param: str | None = None) -> dict:
    """OpenAI's error body. A message that quotes a client's text stays encodable (a lone
    surrogate in it is written as ``\\udXXX``)."""
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}
