"""`kvpd model tiny DIR`: build a tiny random-weight test model with the engine venv's python."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import typer

from kvpd.errors import KvpdError


def tiny(
    out: Path = typer.Argument(..., help="Directory to write the model to."),
    seed: int = typer.Option(0, help="Weight seed: the same seed gives the same bytes."),
    layers: int = typer.Option(2, help="Decoder layers."),
    hidden_size: int = typer.Option(128, help="Hidden size (a multiple of 64)."),
    intermediate_size: int = typer.Option(0, help="MLP size; 0 means 2 x hidden size."),
    vocab_size: int = typer.Option(1024, help="Model vocabulary size."),
    max_len: int = typer.Option(2048, help="Max positions / tokenizer model_max_length."),
    force: bool = typer.Option(False, "--force", help="Rebuild even if DIR is up to date."),
) -> None:
    """Build a random-weight Llama model and a local BPE tokenizer with a chat template.

    Offline and deterministic. The defaults give the 1.1 MB model the `local` profile serves;
    e.g. `--hidden-size 1024 --layers 16` gives a ~380 MB one for prefix-cache benchmarks.
    """
    from kvpd.engine.venv import engine_python

    python = engine_python()
    argv = [
        str(python), "-m", "kvpd.engine.tiny", str(out),
        "--seed", str(seed), "--layers", str(layers), "--hidden-size", str(hidden_size),
        "--intermediate-size", str(intermediate_size), "--vocab-size", str(vocab_size),
        "--max-len", str(max_len),
    ]  # fmt: skip
    if force:
        argv.append("--force")
    env = dict(os.environ)
    # The engine python may not have kvpd installed (KVPD_ENGINE_PYTHON): use this checkout.
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    rc = subprocess.run(argv, env=env).returncode
    if rc == 2:
        raise KvpdError(f"invalid model shape (see above); nothing written to {out}")
    if rc != 0:
        raise KvpdError(f"building the tiny model with {python} failed (exit {rc}), see above")


def register(app: typer.Typer) -> None:
    model_app = typer.Typer(help="Build local test models.", no_args_is_help=True)
    app.add_typer(model_app, name="model")

    model_app.command("tiny")(tiny)
