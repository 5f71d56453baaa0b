"""InferScale assistant core: memory facts, their KV, retrieval and injection.

Everything that is not the Textual UI lives here. Only ``inferscale_core.vllm_plugin`` (and
``bench``) may import vLLM; the math is testable without it.
"""

__version__ = "0.1.0"
