"""`kvpd forward`: the deployment's proxy on this machine's loopback, through the SSH
connection to the proxy's host (as `kubectl port-forward`)."""

from __future__ import annotations

import typer

from kvpd.cli import complete
from kvpd.errors import StateError


def forward_cmd(
    deployment: str | None = typer.Argument(
        None,
        help="Deployment (optional when there is one).",
        autocompletion=complete.deployments,
    ),
    port: int | None = typer.Option(
        None,
        "--port",
        min=0,
        max=65535,
        help="Port on 127.0.0.1 (default: the proxy's own port; 0: any free one).",
    ),  # fmt: skip
) -> None:
    """Serve the deployment's proxy on 127.0.0.1 through the SSH connection to its host,
    so curl and OpenAI clients here reach it. Ctrl-C stops."""
    from kvpd.cli import output
    from kvpd.cli.day2_cmd import split_targets
    from kvpd.exec.forward import forwarder
    from kvpd.exec.http_wire import endpoint
    from kvpd.exec.service import Deployments

    with Deployments() as svc:
        name, _ = split_targets([deployment] if deployment else [], svc.store.deployments())
        plan = svc.store.require(name).plan
        if not plan.proxy_url:
            raise StateError(f"deployment {name!r} has no proxy or serving engine to forward.")
        ep = endpoint(plan.proxy_url)
        t = svc.transports(plan)[plan.proxy_host]
        fwd = forwarder(t, ep.address, ep.port, ep.port if port is None else port,
                        on_error=lambda m: output.err.print(f"forward: {m}"))  # fmt: skip
        output.out.print(
            f"Forwarding http://127.0.0.1:{fwd.port} -> {plan.proxy_url} "
            f"(the proxy on {plan.proxy_host}). Ctrl-C stops."
        )
        try:
            fwd.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            fwd.close()


def register(app: typer.Typer) -> None:
    app.command("forward")(forward_cmd)


def how_to_reach(plan_url: str, host: str, transport: str, deployment: str) -> str:
    """What `up` prints about the serving URL: in the cluster, and how to get it here."""
    if transport == "local":
        return f"Proxy: {plan_url}"
    return (
        f"Proxy: {plan_url} (in the cluster, on {host}). From this machine: "
        f"`kvpd forward {deployment}` serves it on http://127.0.0.1:{plan_url.rsplit(':', 1)[-1]}"
    )
