"""Locate the engine venv's interpreter (torch, transformers and vLLM live only there)."""

from __future__ import annotations

import os
from pathlib import Path

from kvpd.errors import KvpdError

ENV_PYTHON = "KVPD_ENGINE_PYTHON"
ENV_VENV = "KVPD_ENGINE_VENV"


class EngineNotInstalled(KvpdError):
    """The CPU engine venv is missing; `make engine` creates it."""


def repo_root() -> Path:
    """The checkout kvpd is imported from (the engine venv defaults to a folder inside it)."""
    return Path(__file__).resolve().parents[2]


def engine_venv() -> Path:
    return Path(os.environ.get(ENV_VENV) or repo_root() / ".venv-engine")


def engine_python() -> Path:
    """The engine's python: $KVPD_ENGINE_PYTHON, else <engine venv>/bin/python."""
    explicit = os.environ.get(ENV_PYTHON)
    python = Path(explicit) if explicit else engine_venv() / "bin" / "python"
    if not (python.is_file() and os.access(python, os.X_OK)):
        source = f"${ENV_PYTHON}" if explicit else "the engine venv"
        raise EngineNotInstalled(
            f"no engine python at {python} (from {source}). Install the CPU engine with "
            f"`make engine` (scripts/install-engine.sh), or point {ENV_PYTHON} at a python "
            "that has torch, transformers and vllm."
        )
    return python
