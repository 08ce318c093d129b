"""The `kvpd` command: a typer app whose subcommands live in their own modules.

Subcommand modules are imported only when the app is built, never by `import kvpd`, so the core
stays free of typer/rich. Each module exposes `register(app)`.
"""

from __future__ import annotations

import importlib
import sys
import traceback
from pathlib import Path

import typer

from kvpd import __version__
from kvpd.cli.terminal import clean
from kvpd.errors import KvpdError

# Order is the order of `kvpd --help`. Every module must exist: a missing one is a packaging
# bug, and skipping it would silently drop a command.
_COMMAND_MODULES = (
    "kvpd.cli.plan_cmd",
    "kvpd.cli.deploy_cmd",
    "kvpd.cli.day2_cmd",
    "kvpd.cli.forward_cmd",
    "kvpd.cli.bench_cmd",
    "kvpd.cli.proxy_cmd",
    "kvpd.cli.model_cmd",
    "kvpd.cli.native_cmd",
    "kvpd.cli.tune_cmd",
    "kvpd.cli.schema_cmd",
)


def _print_version(value: bool) -> None:
    if value:
        print(f"kvpd {__version__}")
        raise typer.Exit()


def build_app() -> typer.Typer:
    app = typer.Typer(
        name="kvpd",
        help="Plan, start, benchmark and stop P/D-disaggregated vLLM deployments.",
        no_args_is_help=True,
        add_completion=True,  # --install-completion / --show-completion for the user's shell
        pretty_exceptions_enable=False,
    )

    @app.callback()
    def _root(
        version: bool = typer.Option(
            False,
            "--version",
            is_eager=True,
            help="Print kvpd's version and exit.",
            callback=_print_version,
        ),
    ) -> None:
        """Plan, start, benchmark and stop P/D-disaggregated vLLM deployments."""

    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(app)
    return app


def main(argv: list[str] | None = None) -> None:
    """Run the CLI. Usage errors exit 2 (typer), KvpdError exits with its code, and any other
    exception is written to .kvpd/debug.log instead of being shown as a traceback."""
    app = build_app()
    try:
        app(args=argv, prog_name="kvpd")  # standalone mode: exits by itself on success
    except KvpdError as e:
        print(f"kvpd: error: {clean(str(e))}", file=sys.stderr)  # may quote node output
        sys.exit(e.exit_code)
    except Exception as e:  # noqa: BLE001 - last resort: never show a raw traceback
        log = Path(".kvpd") / "debug.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(traceback.format_exc())
        print(
            f"kvpd: internal error: {clean(repr(e))}. Traceback written to {log}", file=sys.stderr
        )
        sys.exit(70)


if __name__ == "__main__":
    main()
