"""What the core needs from an inference engine (vLLM implements it in ``vllm_plugin``).

The chat loop and the benchmarks only see this protocol, so they never import vLLM.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, Protocol

from inferscale_core.composer import ComposedPrompt
from inferscale_core.types import GenerationResult

CHAT_PRIORITY = 0  # lower runs first (vLLM's priority scheduling)
ENCODE_PRIORITY = 10  # encoding requests wait behind every chat turn (and step aside for it)


class Engine(Protocol):
    fingerprint: str  # model fingerprint; stored KV must carry the same

    @property
    def block_size(self) -> int: ...

    @property
    def max_model_len(self) -> int:
        """Tokens of context: prompt and reply together."""
        ...

    @property
    def tokenizer(self) -> Any:
        """The model's Hugging Face tokenizer (the extractor's prompts)."""
        ...

    def stream(
        self, prompt: ComposedPrompt | Sequence[int], **kwargs: Any
    ) -> Iterator[tuple[str, GenerationResult]]:
        """Yield ``(text delta, running result)``; the last result is final."""
        ...

    def astream(
        self, prompt: ComposedPrompt | Sequence[int], **kwargs: Any
    ) -> AsyncIterator[tuple[str, GenerationResult]]:
        """:meth:`stream` for a coroutine on the engine's own event loop (the serving engine);
        an engine without one raises NotImplementedError."""
        ...

    def generate(
        self, prompt: ComposedPrompt | Sequence[int], **kwargs: Any
    ) -> GenerationResult: ...

    def generate_batch(
        self, prompts: Sequence[ComposedPrompt | Sequence[int]], **kwargs: Any
    ) -> list[GenerationResult]:
        """Submit all at once (``priority=`` among the kwargs); results in prompt order."""
        ...

    def generate_json(
        self, prompt_ids: Sequence[int], schema: dict[str, Any], max_tokens: int = 256
    ) -> str:
        """Generate text constrained to ``schema`` (structured output); returns the raw text."""
        ...

    def wait_for_chat(self, timeout: float | None = None) -> bool:
        """Return once no chat prompt waits for its first token (True), or after ``timeout``
        (False): background work calls it between its steps, so a turn has the machine."""
        ...
