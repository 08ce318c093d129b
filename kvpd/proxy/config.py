"""`kvpd proxy` options: the flags of vLLM-Ascend's load_balance_proxy_server_example.py plus
flow, timeouts and health checks, validated into a ProxyConfig."""

from __future__ import annotations

import argparse
import ipaddress
import re
from dataclasses import dataclass, field

from kvpd.errors import KvpdError

# mixed: no prefillers; requests are balanced over engines that prefill and decode themselves
FLOWS = ("prefill-first", "layerwise", "mixed")
WILDCARD_HOSTS = ("0.0.0.0", "::", "0:0:0:0:0:0:0:0", "")


class ProxyConfigError(KvpdError):
    """The proxy's options are inconsistent."""

    exit_code = 2


@dataclass
class ProxyConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    prefillers: list[tuple[str, int]] = field(default_factory=lambda: [("127.0.0.1", 8001)])
    decoders: list[tuple[str, int]] = field(default_factory=lambda: [("127.0.0.1", 8002)])
    flow: str = "prefill-first"
    metaserver_url: str = ""
    connect_timeout: float = 3.0
    prefill_timeout: float = 300.0
    read_timeout: float = 300.0
    max_retries: int = 3
    retry_delay: float = 0.001
    health_interval: float = 2.0
    health_timeout: float = 2.0
    health_path: str = "/health"
    shutdown_grace: float = 1.0
    log_level: str = "INFO"
    access_log: bool = False

    def __post_init__(self) -> None:
        problems = []
        if self.flow not in FLOWS:
            problems.append(f"--flow must be one of {', '.join(FLOWS)}, not {self.flow!r}")
        if self.flow == "mixed":
            self.prefillers = []  # a mixed deployment has only decoders (its engines)
        elif not self.prefillers:
            problems.append(
                "at least one prefiller is needed (--prefiller-hosts/--prefiller-ports)"
            )
        if not self.decoders:
            problems.append("at least one decoder is needed (--decoder-hosts/--decoder-ports)")
        for host, port in [(self.host, self.port), *self.prefillers, *self.decoders]:
            problem = _host_problem(host) or _port_problem(port)
            if problem:
                problems.append(problem)
        for name in ("connect_timeout", "prefill_timeout", "read_timeout", "health_interval",
                     "health_timeout"):  # fmt: skip
            if getattr(self, name) <= 0:
                problems.append(f"--{name.replace('_', '-')} must be > 0")
        if self.max_retries < 0:
            problems.append("--max-retries must be >= 0")
        if self.flow == "layerwise" and not self.metaserver_url and self.host in WILDCARD_HOSTS:
            problems.append(
                f"--flow layerwise needs an address decoders can reach, but --host is "
                f"{self.host!r} (a wildcard): decoders call http://<host>:<port>/v1/metaserver. "
                "Pass the proxy's real IP as --host, or set --metaserver-url."
            )
        if problems:
            raise ProxyConfigError("; ".join(problems))

    @property
    def metaserver(self) -> str:
        if self.metaserver_url:
            return self.metaserver_url
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1/metaserver"


def _host_problem(host: str) -> str:
    if not host or any(c.isspace() for c in host):
        return f"host {host!r} is empty or contains spaces"
    # Shell-joined addresses such as 192.0.0.3192.0.0.3 look numeric but are not IPs.
    if re.fullmatch(r"[0-9.]+", host):
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return f"host {host!r} is not a valid IP address (two addresses run together?)"
    return ""


def _port_problem(port: int) -> str:
    return "" if 0 <= port <= 65535 else f"port {port} is outside 0-65535"


def _pairs(role: str, hosts: list[str], ports: list[int]) -> list[tuple[str, int]]:
    if len(hosts) != len(ports):
        raise ProxyConfigError(
            f"--{role}-hosts has {len(hosts)} entries but --{role}-ports has {len(ports)}: "
            f"give one port per host, in the same order (hosts {' '.join(hosts)}; ports "
            f"{' '.join(map(str, ports))})"
        )
    return list(zip(hosts, ports, strict=True))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvpd proxy",
        description=(
            "Prefill/decode-disaggregated OpenAI proxy. prefill-first: prefill on a prefiller "
            "with max_tokens=1, then decode with its kv_transfer_params. layerwise: decode "
            "first; the decoder calls /v1/metaserver, which starts the prefill. mixed: "
            "balance over engines that do both (no prefillers)."
        ),
    )
    p.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="listen port (default 8000)")
    p.add_argument("--prefiller-hosts", nargs="*", default=["127.0.0.1"], metavar="HOST")
    p.add_argument("--prefiller-ports", nargs="*", type=int, default=[8001], metavar="PORT")
    p.add_argument("--decoder-hosts", nargs="+", default=["127.0.0.1"], metavar="HOST")
    p.add_argument("--decoder-ports", nargs="+", type=int, default=[8002], metavar="PORT")
    p.add_argument("--flow", choices=FLOWS, default="prefill-first")
    p.add_argument(
        "--metaserver-url",
        default="",
        help="URL decoders use to reach /v1/metaserver (layerwise; default from --host/--port)",
    )
    p.add_argument("--connect-timeout", type=float, default=3.0, metavar="S")
    p.add_argument(
        "--prefill-timeout", type=float, default=300.0, metavar="S",
        help="longest wait for a prefiller's answer (default 300)",
    )  # fmt: skip
    p.add_argument(
        "--read-timeout", type=float, default=300.0, metavar="S",
        help="longest silence of a decoder, before or during its stream (default 300)",
    )  # fmt: skip
    p.add_argument(
        "--max-retries", type=int, default=3,
        help="extra attempts on another backend after a connection error or HTTP 5xx",
    )  # fmt: skip
    p.add_argument("--retry-delay", type=float, default=0.001, metavar="S",
                   help="base delay, doubled per attempt")  # fmt: skip
    p.add_argument("--health-interval", type=float, default=2.0, metavar="S")
    p.add_argument("--health-timeout", type=float, default=2.0, metavar="S")
    p.add_argument("--health-path", default="/health")
    p.add_argument("--shutdown-grace", type=float, default=1.0, metavar="S",
                   help="on SIGTERM, how long in-flight requests may finish")  # fmt: skip
    p.add_argument("--log-level", default="INFO",
                   choices=("DEBUG", "INFO", "WARNING", "ERROR", "debug", "info", "warning",
                            "error"))  # fmt: skip
    p.add_argument("--access-log", action="store_true", help="log every request (slower)")
    return p


def parse_args(argv: list[str]) -> ProxyConfig:
    ns = build_parser().parse_args(argv)
    return ProxyConfig(
        host=ns.host,
        port=ns.port,
        prefillers=_pairs("prefiller", ns.prefiller_hosts, ns.prefiller_ports),
        decoders=_pairs("decoder", ns.decoder_hosts, ns.decoder_ports),
        flow=ns.flow,
        metaserver_url=ns.metaserver_url,
        connect_timeout=ns.connect_timeout,
        prefill_timeout=ns.prefill_timeout,
        read_timeout=ns.read_timeout,
        max_retries=ns.max_retries,
        retry_delay=ns.retry_delay,
        health_interval=ns.health_interval,
        health_timeout=ns.health_timeout,
        health_path=ns.health_path,
        shutdown_grace=ns.shutdown_grace,
        log_level=ns.log_level.upper(),
        access_log=ns.access_log,
    )
