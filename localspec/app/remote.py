"""A target across machines: what the front ends share about llama.cpp's RPC servers.

``localspec rpc-server`` runs llama.cpp's own RPC server through the library (:func:`serve`); a pair
whose config names ``model.rpc_servers`` puts the target's layers on them and keeps the draft local
(:mod:`localspec.llama.rpc`). The protocol has no authentication: expose a server only on a private
network.
"""

from __future__ import annotations

import ctypes
import socket
import threading
from collections.abc import Callable

from localspec.llama import rpc

SECURITY_NOTE = (
    "The RPC protocol has no authentication: whoever reaches the port can run computations on this machine "
    "and read what it holds. Keep the default 127.0.0.1, or expose it only on a private network."
)


def serve(host: str, port: int, threads: int, cache_dir: str | None, on_ready: Callable[[str], None]) -> None:
    """Run llama.cpp's RPC server on ``host:port`` until the process is stopped; ``on_ready`` gets the
    endpoint once it answers the protocol's HELLO (never before: a client may connect from then on)."""
    from localspec.llama.model import LlamaSettings

    rpc.parse_endpoint(f"{host}:{port}")  # a bad address is a one-line error, not llama.cpp's abort
    _refuse_busy_port(host, port)
    threads = threads or LlamaSettings().resolved_threads()
    server = threading.Thread(target=rpc.serve, args=(host, port, threads, cache_dir), daemon=True)
    server.start()
    endpoint = f"{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}"
    while server.is_alive():  # llama.cpp says nothing when it listens: ask until it answers
        try:
            rpc.probe(endpoint, timeout=1.0)
            break
        except rpc.RpcServerError:
            server.join(0.05)
    if not server.is_alive():
        raise rpc.RpcServerError(f"the RPC server on {host}:{port} stopped at start-up; see llama.cpp's log above")
    ctypes.CDLL(None).fflush(None)  # llama.cpp's own lines first, so the ready line starts a line of its own
    on_ready(f"{host}:{port}")
    while server.is_alive():  # the server thread never returns; Ctrl-C ends the process here
        server.join(0.5)


def _refuse_busy_port(host: str, port: int) -> None:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError as error:
            raise rpc.RpcServerError(
                f"cannot listen on {host}:{port} ({error.strerror}); choose another --port or stop what uses it"
            ) from None


def reconnect(lost: str, close_old: Callable[[], None]) -> None:
    """Before a target lost with a server is reloaded: that server must answer again (else it is named). The
    old model is freed while its messages to the lost server are still dropped (the restarted server never
    held its buffers), then llama.cpp's record of the loss is cleared and its next message connects anew."""
    rpc.probe(lost)
    close_old()
    rpc.forget_lost()


def server_lines(endpoints: tuple[str, ...]) -> list[str]:
    """One line per server for the doctor and the bench header: its protocol, devices and free memory, or
    why it cannot be used."""
    lines = []
    for endpoint in endpoints:
        try:
            lines.append("RPC server " + rpc.probe(endpoint).line())
        except rpc.RpcServerError as error:
            lines.append(f"RPC server {endpoint}: {error}")
    return lines
