"""The local CPU vLLM engine: where its venv lives and the tiny test models it serves."""
