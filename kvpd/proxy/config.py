"""`kvpd proxy` options: the flags of vLLM-Ascend's load_balance_proxy_server_example.py plus
flow, timeouts, health checks, circuit breaker and admin access, validated into one ProxyConfig.

Every default is stated once, on the dataclass field; the argparse flags are built from the
fields. Secrets (the client key, the backend key, the admin token) are read here, from the
environment or a file, never from the command line (where any local user could read them in
`ps`). Two keys are kept apart: the client key is what the proxy's own clients must present;
OPENAI_API_KEY in the proxy's environment is a credential for the backends, which the proxy
attaches only to requests it has authenticated."""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from kvpd.errors import KvpdError
from kvpd.proxy.cache_aware import ROUTING_POLICIES
from kvpd.proxy.http1 import MAX_BODY_BYTES

# mixed: no prefillers; requests are balanced over engines that prefill and decode themselves
FLOWS = ("prefill-first", "layerwise", "mixed")
WILDCARD_HOSTS = ("0.0.0.0", "::", "0:0:0:0:0:0:0:0", "")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
ADMIN_TOKEN_ENV = "KVPD_PROXY_ADMIN_TOKEN"
CLIENT_KEY_ENV = "KVPD_PROXY_CLIENT_KEY"
BACKEND_KEY_ENV = "OPENAI_API_KEY"
MIN_SECRET_CHARS = 32  # e.g. `openssl rand -hex 16` or more
OPEN_PATHS = "/health,/healthcheck,/metrics"


class ProxyConfigError(KvpdError):
    """The proxy's options are inconsistent."""

    exit_code = 2


def _opt(default: Any, help_text: str = "", metavar: str | None = None) -> Any:
    """A field that is also a command-line flag (`--name-with-dashes`)."""
    return field(default=default, metadata={"help": help_text, "metavar": metavar})


@dataclass(frozen=True)
class ProxyConfig:
    host: str = _opt("127.0.0.1", "listen address")
    port: int = _opt(8000, "listen port")
    prefillers: tuple[tuple[str, int], ...] = (("127.0.0.1", 8001),)
    decoders: tuple[tuple[str, int], ...] = (("127.0.0.1", 8002),)
    flow: str = _opt("prefill-first", "")
    metaserver_url: str = _opt(
        "", "URL decoders use to reach /v1/metaserver (layerwise; default from --host/--port)"
    )
    connect_timeout: float = _opt(3.0, "longest wait for a backend connection", "S")
    prefill_timeout: float = _opt(
        0.0,
        "longest wait for a prefiller's answer; 0: no limit, as vLLM-Ascend's proxies (a "
        "128k-token prefill takes minutes)",
        "S",
    )
    first_byte_timeout: float = _opt(
        0.0,
        "longest wait for a decoder's first byte; 0: no limit (with --flow layerwise the "
        "decoder answers only after the whole prefill)",
        "S",
    )
    read_timeout: float = _opt(
        300.0, "longest silence of a decoder between stream chunks, once it answers", "S"
    )
    client_timeout: float = _opt(
        30.0,
        "longest a client may stall: sending its request head or body, or not reading the "
        "response while a stream waits for it",
        "S",
    )
    idle_timeout: float = _opt(300.0, "close client keep-alive connections idle this long", "S")
    max_connections: int = _opt(
        8192, "client connections served at once; more are answered 503 and closed", "N"
    )
    max_connections_per_peer: int = _opt(
        1024, "client connections one IP address may hold at once; more are answered 503", "N"
    )
    max_body_bytes: int = _opt(
        16 * 1024 * 1024, f"largest request body (at most {MAX_BODY_BYTES}); larger: 413", "N"
    )
    max_buffered_bytes: int = _opt(
        256 * 1024 * 1024,
        "request body bytes all clients together may have buffered in the proxy; a body "
        "arriving beyond that is answered 503",
        "N",
    )
    max_retries: int = _opt(
        3, "extra attempts on another backend after a connection error or HTTP 5xx", "N"
    )
    retry_delay: float = _opt(0.001, "base delay between attempts, doubled per attempt", "S")
    health_interval: float = _opt(2.0, "seconds between health checks of every backend", "S")
    health_timeout: float = _opt(2.0, "", "S")
    health_path: str = _opt("/health", "")
    breaker_failures: int = _opt(
        3, "consecutive failed requests that take a backend out (circuit open)", "N"
    )
    breaker_cooldown: float = _opt(
        10.0, "seconds a circuit stays open before a healthy backend is probed again", "S"
    )
    routing: str = _opt(
        "cache-aware",
        "how a prefiller (or, with --flow mixed, an engine) is chosen: cache-aware = the one "
        "already sent the longest prefix of the prompt, unless it is too loaded "
        "(--balance-abs-tokens, --balance-rel); least-loaded = the fewest outstanding tokens",
    )
    prefix_capacity_tokens: int = _opt(
        1 << 20,
        "tokens of prompt prefixes remembered per backend, least recently used dropped first: "
        "about its KV cache's capacity (number of GPU blocks x block size)",
        "N",
    )
    prefix_block: int = _opt(
        32,
        "tokens of the first indexed prompt chunks, the finest granularity of prefix matches "
        "(chunks double every two, up to 8 times this; token ids, or text at 4 characters a "
        "token); coarser costs less CPU per request",
        "N",
    )
    balance_abs_tokens: int = _opt(
        4096,
        "cache-aware: route by load when the best match has this many outstanding tokens more "
        "than the least loaded backend, divided by the requests that shared its prefix ...",
        "N",
    )
    balance_rel: float = _opt(1.5, "... and more than this many times as many", "X")
    decode_affinity: bool = _opt(
        False,
        "with --routing cache-aware, choose decoders by prompt prefix too, so the turns of a "
        "conversation return to the decoder that holds its earlier turns",
    )
    drain_timeout: float = _opt(60.0, "default bound of an admin drain's wait", "S")
    shutdown_grace: float = _opt(1.0, "on SIGTERM, how long in-flight requests may finish", "S")
    admin_token_file: str = _opt(
        "",
        f"file holding the admin token (mode 0600; or set {ADMIN_TOKEN_ENV}). /admin/* needs "
        "`Authorization: Bearer <token>`; without a token the admin interface is off",
        "PATH",
    )
    client_key_file: str = _opt(
        "",
        f"file holding the key clients must send as `Authorization: Bearer <key>` (mode "
        f"0600; or set {CLIENT_KEY_ENV}); without one the proxy passes each client's own "
        "Authorization to the backends",
        "PATH",
    )
    open_paths: str = _opt(
        OPEN_PATHS, "comma-separated paths served without the client key", "PATHS"
    )
    log_level: str = _opt("INFO", "")
    access_log: bool = _opt(False, "log every request (slower)")
    # Secrets, never flags: read from the environment or the *-file flags by parse_args.
    api_key: str = field(default="", repr=False)  # for the backends (OPENAI_API_KEY)
    admin_token: str = field(default="", repr=False)
    client_key: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        if self.flow == "mixed":
            # a mixed deployment has only decoders (its engines)
            object.__setattr__(self, "prefillers", ())
        problems = self._peer_problems() + self._bound_problems() + self._policy_problems()
        if problems:
            raise ProxyConfigError("; ".join(problems))

    def _peer_problems(self) -> list[str]:
        """The flow, and the addresses of the proxy and of its prefillers and decoders."""
        problems = []
        if self.flow not in FLOWS:
            problems.append(f"--flow must be one of {', '.join(FLOWS)}, not {self.flow!r}")
        if self.flow != "mixed" and not self.prefillers:
            problems.append(
                "at least one prefiller is needed (--prefiller-hosts/--prefiller-ports)"
            )
        if not self.decoders:
            problems.append("at least one decoder is needed (--decoder-hosts/--decoder-ports)")
        for host, port in [(self.host, self.port), *self.prefillers, *self.decoders]:
            problem = _host_problem(host) or _port_problem(port)
            if problem:
                problems.append(problem)
        return problems

    def _bound_problems(self) -> list[str]:
        """Timeouts, retries and sizes within their bounds."""
        problems = []
        for name in ("connect_timeout", "read_timeout", "client_timeout",
                     "idle_timeout", "health_interval", "health_timeout", "breaker_cooldown",
                     "drain_timeout"):  # fmt: skip
            if getattr(self, name) <= 0:
                problems.append(f"--{name.replace('_', '-')} must be > 0")
        for name in ("max_retries", "shutdown_grace", "prefill_timeout", "first_byte_timeout"):
            if getattr(self, name) < 0:
                problems.append(f"--{name.replace('_', '-')} must be >= 0")
        for name in ("max_connections", "breaker_failures", "max_connections_per_peer",
                     "max_body_bytes", "max_buffered_bytes"):  # fmt: skip
            if getattr(self, name) < 1:
                problems.append(f"--{name.replace('_', '-')} must be >= 1")
        if self.max_body_bytes > MAX_BODY_BYTES:
            problems.append(f"--max-body-bytes must be <= {MAX_BODY_BYTES}")
        return problems

    def _policy_problems(self) -> list[str]:
        """Open paths, keys, routing, logging and the layerwise flow's metaserver address."""
        problems = _path_problems(self.open_paths)
        if self.api_key and not self.client_key:
            problems.append(
                f"{BACKEND_KEY_ENV} is set: it is a credential for the backends, and without a "
                "client key the proxy would attach it to every request, from anyone. Give the "
                f"proxy the key its clients send (--client-key-file PATH or {CLIENT_KEY_ENV}), "
                f"or unset {BACKEND_KEY_ENV} to pass each client's own key to the backends"
            )
        if self.routing not in ROUTING_POLICIES:
            problems.append(
                f"--routing must be one of {', '.join(ROUTING_POLICIES)}, not {self.routing!r}"
            )
        for name in ("prefix_capacity_tokens", "prefix_block"):
            if getattr(self, name) < 1:
                problems.append(f"--{name.replace('_', '-')} must be >= 1")
        if self.balance_abs_tokens < 0:
            problems.append("--balance-abs-tokens must be >= 0")
        if self.balance_rel < 1:
            problems.append("--balance-rel must be >= 1")
        if self.log_level not in LOG_LEVELS:
            problems.append(f"--log-level must be one of {', '.join(LOG_LEVELS)}")
        if self.flow == "layerwise" and not self.metaserver_url and self.host in WILDCARD_HOSTS:
            problems.append(
                f"--flow layerwise needs an address decoders can reach, but --host is "
                f"{self.host!r} (a wildcard): decoders call http://<host>:<port>/v1/metaserver. "
                "Pass the proxy's real IP as --host, or set --metaserver-url."
            )
        return problems

    @property
    def metaserver(self) -> str:
        if self.metaserver_url:
            return self.metaserver_url
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1/metaserver"

    @property
    def open_path_set(self) -> frozenset[bytes]:
        return frozenset(p.strip().encode() for p in self.open_paths.split(",") if p.strip())

    def with_port(self, port: int) -> ProxyConfig:
        return replace(self, port=port)


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


def _path_problems(paths: str) -> list[str]:
    bad = [p for p in paths.split(",") if p.strip() and not re.fullmatch(r"/[!-~]*", p.strip())]
    return [f"--open-paths: {p.strip()!r} is not a path (e.g. /health)" for p in bad]


def _port_problem(port: int) -> str:
    return "" if 0 <= port <= 65535 else f"port {port} is outside 0-65535"


def _pairs(role: str, hosts: list[str], ports: list[int]) -> tuple[tuple[str, int], ...]:
    if len(hosts) != len(ports):
        raise ProxyConfigError(
            f"--{role}-hosts has {len(hosts)} entries but --{role}-ports has {len(ports)}: "
            f"give one port per host, in the same order (hosts {' '.join(hosts)}; ports "
            f"{' '.join(map(str, ports))})"
        )
    return tuple(zip(hosts, ports, strict=True))


def read_secret_file(flag: str, path: str) -> str:
    """A token or key from a file that only its owner can read (the launcher writes it 0600)."""
    p = Path(path)
    try:
        mode = p.stat().st_mode
        secret = p.read_text().strip()
    except (OSError, UnicodeDecodeError) as e:
        why = getattr(e, "strerror", None) or e
        raise ProxyConfigError(f"{flag} {path}: cannot read it ({why})") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ProxyConfigError(
            f"{flag} {path}: mode {stat.S_IMODE(mode):04o} lets other users read "
            f"it; run `chmod 600 {path}`"
        )
    problem = secret_problem(secret)
    if problem:
        raise ProxyConfigError(f"{flag} {path}: {problem}")
    return secret


def read_admin_token(path: str) -> str:
    return read_secret_file("--admin-token-file", path)


def secret_problem(secret: str) -> str:
    """Why `secret` cannot be a token or key ("" = it can)."""
    if len(secret) < MIN_SECRET_CHARS or any(c.isspace() or not c.isprintable() for c in secret):
        return (
            f"it must be one line of at least {MIN_SECRET_CHARS} printable characters "
            "without spaces (e.g. from `openssl rand -hex 32`)"
        )
    return ""


def _secret(env: Mapping[str, str], flag: str, path: str, name: str) -> str:
    if path:
        return read_secret_file(flag, path)
    value = env.get(name, "").strip()
    problem = secret_problem(value) if value else ""
    if problem:
        raise ProxyConfigError(f"{name} (environment): {problem}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvpd proxy",
        allow_abbrev=False,  # `--admin-token SECRET` must fail, not read a file named SECRET
        description=(
            "Prefill/decode-disaggregated OpenAI proxy. prefill-first: prefill on a prefiller "
            "with max_tokens=1, then decode with its kv_transfer_params. layerwise: decode "
            "first; the decoder calls /v1/metaserver, which starts the prefill. mixed: "
            "balance over engines that do both (no prefillers). OPENAI_API_KEY, if set, is "
            "a credential for the backends: the proxy sends it to them as a bearer token, "
            "only for clients that presented the client key."
        ),
    )
    d = ProxyConfig()  # the defaults
    p.add_argument("--prefiller-hosts", nargs="*", metavar="HOST",
                   default=[h for h, _ in d.prefillers])  # fmt: skip
    p.add_argument("--prefiller-ports", nargs="*", type=int, metavar="PORT",
                   default=[pt for _, pt in d.prefillers])  # fmt: skip
    p.add_argument("--decoder-hosts", nargs="+", metavar="HOST",
                   default=[h for h, _ in d.decoders])  # fmt: skip
    p.add_argument("--decoder-ports", nargs="+", type=int, metavar="PORT",
                   default=[pt for _, pt in d.decoders])  # fmt: skip
    choices = {
        "flow": FLOWS,
        "routing": ROUTING_POLICIES,
        "log_level": LOG_LEVELS + tuple(x.lower() for x in LOG_LEVELS),
    }
    for f in fields(ProxyConfig):
        if "help" not in f.metadata:
            continue
        flag = "--" + f.name.replace("_", "-")
        help_text = f.metadata["help"]
        if f.type == "bool":
            p.add_argument(flag, action="store_true", help=help_text)
            continue
        kind = {"int": int, "float": float}.get(str(f.type), str)
        p.add_argument(
            flag,
            type=kind,
            default=f.default,
            choices=choices.get(f.name),
            metavar=f.metadata["metavar"],
            help=f"{help_text} (default {f.default!r})" if help_text else f"default {f.default!r}",
        )
    return p


def parse_args(argv: list[str], environ: dict[str, str] | None = None) -> ProxyConfig:
    env = os.environ if environ is None else environ
    ns = vars(build_parser().parse_args(argv))
    prefillers = _pairs("prefiller", ns.pop("prefiller_hosts"), ns.pop("prefiller_ports"))
    decoders = _pairs("decoder", ns.pop("decoder_hosts"), ns.pop("decoder_ports"))
    ns["log_level"] = ns["log_level"].upper()
    token = _secret(env, "--admin-token-file", ns["admin_token_file"], ADMIN_TOKEN_ENV)
    key = _secret(env, "--client-key-file", ns["client_key_file"], CLIENT_KEY_ENV)
    return ProxyConfig(
        prefillers=prefillers,
        decoders=decoders,
        api_key=env.get(BACKEND_KEY_ENV, ""),
        admin_token=token,
        client_key=key,
        **ns,
    )
