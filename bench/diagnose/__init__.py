"""One-off investigations of where time goes (GPU host, vLLM step); not part of the benches."""
