"""The only code that imports vLLM: the KV connector and the in-process engine wrapper.

vLLM loads the connector by module path (``inferscale_core.vllm_plugin.connector``) in every
process it runs in, so it only gets plain configuration (``kv_connector_extra_config``).
"""
