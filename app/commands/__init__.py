"""The subcommands of ``inferscale-assistant``: one module each, with ``register(sub)``."""
