"""`kvpd forward`: a port on this machine's loopback relayed to a port on a host through the
host's transport (over SSH one direct-tcpip channel of the pooled connection per accepted
connection), as `kubectl port-forward` does, so curl and OpenAI clients on the operator's
machine reach a proxy that only the cluster can reach."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import Any

from kvpd.errors import KvpdError
from kvpd.exec.transport import ChannelError, Streams

CHUNK = 64 * 1024
LOOPBACK = "127.0.0.1"


class Forwarder:
    """Listens on 127.0.0.1:`port` (0: any free one); each connection gets a stream from
    `open_stream()` and bytes are relayed both ways until either side closes."""

    def __init__(
        self, open_stream: Callable[[], Any], port: int = 0, on_error: Callable[[str], None] = print
    ) -> None:
        self._open = open_stream
        self._on_error = on_error
        try:
            self._server = socket.create_server((LOOPBACK, port))
        except OSError as e:
            raise KvpdError(
                f"cannot listen on {LOOPBACK}:{port}: {e.strerror or e}. Fix: choose another "
                "port with --port."
            ) from None
        self.port: int = self._server.getsockname()[1]
        self._stop = threading.Event()

    def serve_forever(self) -> None:
        """Accept until `close()`; each connection is relayed by its own threads."""
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return  # closed
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def close(self) -> None:
        self._stop.set()
        self._server.close()

    def _relay(self, client: socket.socket) -> None:
        try:
            remote = self._open()
        except ChannelError as e:
            self._on_error(str(e))
            client.close()
            return
        back = threading.Thread(target=_pump, args=(remote, client), daemon=True)
        back.start()
        _pump(client, remote)
        back.join()
        remote.close()
        client.close()


def _pump(src: Any, dst: Any) -> None:
    """Copy src to dst until src's end; then end dst's writing side (half close)."""
    try:
        while True:
            data = src.recv(CHUNK)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass  # a reset on either side ends this direction
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def forwarder(t: object, address: str, port: int, local_port: int, **kw: Any) -> Forwarder:
    """A Forwarder to `address:port` as the host of transport `t` reaches it."""
    if not isinstance(t, Streams):
        raise KvpdError(f"the transport of this host ({type(t).__name__}) carries no streams")
    return Forwarder(lambda: t.open_stream(address, port, timeout_s=10.0), local_port, **kw)
