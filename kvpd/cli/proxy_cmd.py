"""`kvpd proxy`: run the P/D proxy in the foreground (the flags are parsed by argparse so that
list flags take several values, as in vLLM-Ascend's example proxy)."""

from __future__ import annotations

import typer


def proxy(ctx: typer.Context) -> None:
    """Run the P/D proxy (prefill-first or layerwise). See `kvpd proxy --help`."""
    from kvpd.proxy.app import run_from_argv

    run_from_argv(list(ctx.args))


def register(app: typer.Typer) -> None:
    app.command(
        "proxy",
        add_help_option=False,
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(proxy)
