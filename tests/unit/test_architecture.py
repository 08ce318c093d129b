"""The shape of the package, as docs/architecture.md states it: no import cycle, small modules,
dependencies pointing one way (cli -> bench -> exec -> plan -> profile), node side apart.

Only module-level imports count: an import inside a function or under `TYPE_CHECKING` runs
late (or never) and cannot make a cycle at import time.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "kvpd"
MAX_LINES = 400
# Controller rooms from the top down: a room may import the rooms after it, never those before.
LAYERS = ("cli", "bench", "exec", "plan", "profile")
# Rooms that run on the hosts: they import none of the controller's rooms.
NODE_SIDE = ("proxy", "connectors", "native", "supervisor", "testing.backend")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _top_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Imports that run when the module is imported: at module level, in try/if blocks too,
    but not in functions, classes, or `if TYPE_CHECKING:`."""
    found: list[ast.Import | ast.ImportFrom] = []
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                pending.extend(node.body)
            pending.extend(node.orelse)
        elif isinstance(node, ast.Try):
            pending.extend(node.body + node.orelse + node.finalbody)
            for handler in node.handlers:
                pending.extend(handler.body)
    return found


def _resolve(
    module: str, is_package: bool, node: ast.Import | ast.ImportFrom, modules: set[str]
) -> list[str]:
    """The kvpd modules an import statement names: `from kvpd.x import y` names the module
    kvpd.x.y if there is one (a submodule, whose package is merely its parent), else kvpd.x."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    return [
        f"{prefix}.{alias.name}" if f"{prefix}.{alias.name}" in modules else prefix
        for alias in node.names
    ]


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_package = path.name == "__init__.py"
        edges: set[str] = set()
        for node in _top_level_imports(tree):
            for target in _resolve(name, is_package, node, set(modules)):
                if target in modules and target != name:
                    edges.add(target)
        graph[name] = edges
    return graph


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def _room(module: str) -> str:
    parts = module.split(".")[1:]
    return ".".join(parts[:2]) if parts[:2] == ["testing", "backend"] else (parts or [""])[0]


def test_no_import_cycle() -> None:
    cycle = _find_cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: p.name)
def test_module_is_small(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(PACKAGE.parent)}: {lines} lines > {MAX_LINES}"


def test_controller_rooms_import_only_downward() -> None:
    upward = []
    for module, targets in _graph().items():
        room = _room(module)
        if room not in LAYERS:
            continue
        for target in targets:
            other = _room(target)
            if other in LAYERS and LAYERS.index(other) < LAYERS.index(room):
                upward.append(f"{module} -> {target}")
    assert not upward, "imports against cli -> bench -> exec -> plan -> profile: " + ", ".join(
        sorted(upward)
    )


def test_node_side_imports_no_controller_room() -> None:
    reaching = [
        f"{module} -> {target}"
        for module, targets in _graph().items()
        if _room(module) in NODE_SIDE
        for target in targets
        if _room(target) in LAYERS
    ]
    assert not reaching, "node side importing the controller: " + ", ".join(sorted(reaching))


# The only controller modules that open network connections: the SSH connection to a host's
# sshd (or the first jump host), the plain socket of the local transport, and `kvpd forward`'s
# listener on this machine's loopback. Every other exchange with a cluster port goes through
# a transport (Transport.http), so a cluster whose ports only its hosts reach works.
SOCKET_MODULES = {"kvpd.exec.ssh.connect", "kvpd.exec.http_wire", "kvpd.exec.forward",
                  "kvpd.testing.clock"}  # fmt: skip  # clock: binds loopback for a free port
# Rooms that run on the hosts or stand in for an engine there: they serve and call ports of
# their own host, never the controller's way in.
NODE_PROCESSES = (*NODE_SIDE, "engine", "testing.standin_engine")
_CLIENT_MODULES = ("urllib.request", "http.client", "requests", "httpx", "aiohttp", "socket")
_SOCKET_CALLS = {"create_connection", "socket", "connect", "connect_ex", "urlopen"}


def _network_uses(tree: ast.Module) -> list[str]:
    """Imports of an HTTP client, and calls that make a socket, anywhere in the module (also
    inside functions: a late import opens a socket as well). `socket` as a type is fine."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name in _CLIENT_MODULES[:-1]]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = {f"{node.module}.{a.name}" for a in node.names}
            found += [n for n in names if n in _CLIENT_MODULES or n.startswith("http.client")]
            if node.module == "socket":
                found += [f"socket.{a.name}" for a in node.names if a.name in _SOCKET_CALLS]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _SOCKET_CALLS
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "socket"
        ):
            found.append(f"socket.{node.func.attr}")
    return found


def _is_node_process(module: str) -> bool:
    rest = module.removeprefix("kvpd.")
    return any(rest == r or rest.startswith(r + ".") for r in NODE_PROCESSES)


def test_only_the_transport_layer_opens_sockets() -> None:
    """No code path of the controller opens a socket to a cluster port itself."""
    offenders = []
    for module, path in _modules().items():
        if module in SOCKET_MODULES or _is_node_process(module):
            continue
        uses = _network_uses(ast.parse(path.read_text(), filename=str(path)))
        offenders += [f"{module}: {u}" for u in uses]
    assert not offenders, (
        "network clients outside the transport layer (send them through Transport.http): "
        + ", ".join(sorted(offenders))
    )


def test_the_socket_rule_sees_a_direct_connection() -> None:
    bad = "import urllib.request\nimport socket\ns = socket.create_connection(('p1', 7800))\n"
    assert _network_uses(ast.parse(bad)) == ["urllib.request", "socket.create_connection"]
    fine = "import socket\nsocket.gethostname()\ndef f() -> socket.socket: ...\n"
    assert _network_uses(ast.parse(fine)) == []
