"""llama.cpp's RPC backend: the target's layers on other machines (``rpc-server`` on each), the draft local.

A server is llama.cpp's own (:func:`serve`, what ``localspec rpc-server`` runs); the client is llama.cpp's
RPC backend, given to the target as devices (:func:`connect`). llama.cpp's client aborts the whole process
when it cannot connect or the server speaks another protocol version, so each endpoint is first probed here
(:func:`probe`: a TCP connect, the protocol's HELLO, its devices' memory) and a failure is named in one line
before anything loads. A server that stops answering mid-reply no longer aborts the client (localspec's
patch ``rpc-server-loss-not-fatal``): :func:`lost_server` names it after the decode. RPC devices are never
registered globally, so a model loaded without a device list (the draft) sees only local devices.

The protocol has no authentication: a server runs whatever graph a client sends and holds what it is
given. Expose it only on a private network.
"""

from __future__ import annotations

import ctypes
import functools
import socket
import struct
from dataclasses import dataclass

from localspec.core.errors import ConfigError, RpcServerError
from localspec.llama.runtime import _ggml, start

DEFAULT_PORT = 50052
PROTOCOL = (7, 0)  # vendored ggml-rpc.h: RPC_PROTO_MAJOR_VERSION, and the newest minor version the client takes
CMD_GET_DEVICE_MEMORY, CMD_HELLO, CMD_DEVICE_COUNT = 11, 14, 15  # ggml-rpc.cpp: enum rpc_cmd
CAPS_BYTES = 24  # ggml-rpc transport.h: RPC_CONN_CAPS_SIZE (all zero: plain TCP)
PROBE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class ServerInfo:
    """What an RPC server answered: its protocol version and each device's free and total bytes."""

    endpoint: str
    version: tuple[int, int, int]
    memory: tuple[tuple[int, int], ...]  # (free, total) per device

    @property
    def free_bytes(self) -> int:
        return sum(free for free, _ in self.memory)

    def line(self) -> str:
        """``127.0.0.1:50052: protocol 7.0.0, 1 device, 21.3 GiB free`` for the doctor and the bench header."""
        devices = f"{len(self.memory)} device" + ("s" if len(self.memory) != 1 else "")
        return f"{self.endpoint}: protocol {'.'.join(map(str, self.version))}, {devices}, " \
               f"{self.free_bytes / 2**30:.1f} GiB free"  # fmt: skip


def parse_endpoint(text: str) -> tuple[str, int]:
    """``host:port`` (an IPv6 host in brackets) as (host, port); a bad one is a :class:`ConfigError`."""
    host, sep, port = text.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"RPC server {text!r} is not host:port; write it like 192.168.1.20:{DEFAULT_PORT}")
    return host, int(port)


def probe(endpoint: str, timeout: float = PROBE_TIMEOUT_S) -> ServerInfo:
    """Ask ``endpoint`` what llama.cpp's client would, before llama.cpp does (its failures abort the process)."""
    host, port = parse_endpoint(endpoint)
    start_hint = f"start it there with `localspec rpc-server --host {host} --port {port}`"
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise RpcServerError(f"RPC server {endpoint} does not answer ({reason}); {start_hint}") from None
    try:
        with sock:
            hello = _exchange(sock, CMD_HELLO, bytes(CAPS_BYTES), None)
            if len(hello) != 4 + CAPS_BYTES:
                raise RpcServerError(
                    f"RPC server {endpoint} answered a protocol this build does not speak (a {len(hello)}-byte "
                    f"HELLO); run the same localspec version there, built from the same llama.cpp"
                )
            version = (hello[0], hello[1], hello[2])
            if version[0] != PROTOCOL[0] or version[1] > PROTOCOL[1]:
                raise RpcServerError(
                    f"RPC server {endpoint} speaks protocol {'.'.join(map(str, version))}, this build "
                    f"{PROTOCOL[0]}.{PROTOCOL[1]}; run the same localspec version there, built from the same llama.cpp"
                )
            (count,) = struct.unpack("<I", _exchange(sock, CMD_DEVICE_COUNT, b"", 4))
            memory = tuple(
                struct.unpack("<QQ", _exchange(sock, CMD_GET_DEVICE_MEMORY, struct.pack("<I", device), 16))
                for device in range(count)
            )
    except TimeoutError:
        raise RpcServerError(
            f"RPC server {endpoint} accepted the connection but did not answer within {timeout:g} s: it serves one "
            "client at a time — is another program using it?"
        ) from None
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise RpcServerError(f"RPC server {endpoint} does not answer ({reason}); {start_hint}") from None
    if not memory:
        raise RpcServerError(f"RPC server {endpoint} has no device to compute on; {start_hint}")
    return ServerInfo(endpoint, version, memory)


def _exchange(sock: socket.socket, command: int, request: bytes, answer_bytes: int | None) -> bytes:
    """One request and its answer: | command (1 byte) | size (8) | request |, then | size (8) | answer |."""
    sock.sendall(bytes([command]) + struct.pack("<Q", len(request)) + request)
    (size,) = struct.unpack("<Q", _receive(sock, 8))
    if answer_bytes is not None and size != answer_bytes:
        raise OSError(0, f"a {size}-byte answer where {answer_bytes} were expected")
    if size > 1 << 20:
        raise OSError(0, f"an answer of {size} bytes")
    return _receive(sock, size)


def _receive(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise OSError(0, "the connection closed")
        data += chunk
    return data


def check_memory(servers: list[ServerInfo], needed_bytes: int) -> None:
    """Name the server that cannot hold its share of ``needed_bytes`` (llama.cpp splits layers by free memory)."""
    total_free = sum(server.free_bytes for server in servers)
    if total_free < needed_bytes:
        short = min(servers, key=lambda server: server.free_bytes)
        raise RpcServerError(
            f"RPC servers have {total_free / 2**30:.1f} GiB free together, the target needs "
            f"{needed_bytes / 2**30:.1f}; {short.endpoint} has the least ({short.free_bytes / 2**30:.1f} GiB): "
            "free memory there or add a server"
        )


@functools.cache
def _library():
    """The RPC registry's entry points (ggml-rpc, loaded with ggml), declared once."""
    start()
    lib = _ggml()
    registry = lib.ggml_backend_reg_by_name(b"RPC")
    if not registry:
        raise RpcServerError(
            "this llama.cpp build has no RPC backend; run `make install` (it builds with -DGGML_RPC=ON)"
        )
    return lib, registry


def _function(name: str, restype, argtypes):
    lib, registry = _library()
    address = lib.ggml_backend_reg_get_proc_address(registry, name.encode())
    if not address:
        raise RpcServerError(f"this llama.cpp build's RPC backend has no {name}; run `make install`")
    return ctypes.CFUNCTYPE(restype, *argtypes)(address)


def target_devices(endpoints: tuple[str, ...], needed_bytes: int) -> ctypes.Array:
    """A target's device list: the servers' RPC devices, then the local GPUs, NULL-terminated (llama.cpp
    splits the layers over them by free memory). Every server is probed and its memory checked first."""
    from localspec.llama.runtime import offload_devices

    servers = [probe(endpoint) for endpoint in endpoints if endpoint not in _connected]  # ours answer already
    lib, _ = _library()
    gpus = offload_devices()
    local = [lib.ggml_backend_dev_by_name(device.name.encode()) for device in gpus]
    local_free = sum(device.free_bytes for device in gpus)
    if servers:
        check_memory(servers, needed_bytes - local_free)
    chosen = connect(endpoints) + local
    return (ctypes.c_void_p * (len(chosen) + 1))(*chosen, None)


# Endpoints this process's llama.cpp holds a connection to. A server serves one client at a time, so a probe
# of one of them would wait behind our own connection; llama.cpp keeps that connection for the process.
_connected: set[str] = set()


def connect(endpoints: tuple[str, ...]) -> list[int]:
    """The RPC devices of ``endpoints`` (probed already), for a model's device list; not registered globally."""
    add_server = _function("ggml_backend_rpc_add_server", ctypes.c_void_p, [ctypes.c_char_p])
    lib, _ = _library()
    found = []
    for endpoint in endpoints:
        registry = add_server(endpoint.encode())
        if not registry:
            raise RpcServerError(f"RPC server {endpoint} has no device to compute on")
        _connected.add(endpoint)
        found += [lib.ggml_backend_reg_dev_get(registry, i) for i in range(lib.ggml_backend_reg_dev_count(registry))]
    return found


@functools.cache
def _patch():
    """localspec's ``rpc-server-loss-not-fatal`` entry points in the ggml-rpc llama.cpp loaded, or None in a
    build without it. Asked by its soname, which finds the loaded library: the wheel holds copies of each
    library under every name, and a copy opened by path would keep a failure record of its own."""
    _library()  # llama.cpp's libraries are loaded
    for name in ("libggml-rpc.so.0", "libggml-rpc.dylib", "ggml-rpc.dll"):
        try:
            loaded = ctypes.CDLL(name)
        except OSError:
            continue
        if hasattr(loaded, "localspec_rpc_failure"):
            loaded.localspec_rpc_failure.restype = ctypes.c_char_p
            loaded.localspec_rpc_reset.restype = None
            return loaded
    return None


def lost_server() -> str | None:
    """The endpoint of a server that stopped answering since the last :func:`forget_lost`, if any."""
    patched = _patch()
    failed = patched.localspec_rpc_failure() if patched is not None else None
    return failed.decode() if failed else None


def forget_lost() -> None:
    """Clear the record once every model that used the lost server is freed (before a reload)."""
    if _patch() is not None:
        _patch().localspec_rpc_reset()


def serve(host: str, port: int, threads: int, cache_dir: str | None) -> None:
    """Run llama.cpp's RPC server on ``host:port`` until the process ends (a GPU if there is one, else the CPU)."""
    start_server = _function(
        "ggml_backend_rpc_start_server",
        None,
        [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)],
    )
    lib, _ = _library()
    every = [lib.ggml_backend_dev_get(index) for index in range(lib.ggml_backend_dev_count())]
    gpus = [device for device in every if lib.ggml_backend_dev_type(device) in (GPU, IGPU)]
    chosen = gpus or [device for device in every if lib.ggml_backend_dev_type(device) == CPU][:1]
    array = (ctypes.c_void_p * len(chosen))(*chosen)
    start_server(f"{host}:{port}".encode(), cache_dir.encode() if cache_dir else None, threads, len(chosen), array)


CPU, GPU, IGPU = 0, 1, 2  # ggml_backend_dev_type
