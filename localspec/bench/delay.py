"""A TCP proxy on loopback that delays every byte: a network link where the kernel has no netem.

Each direction of each connection is a queue: a chunk read at time t is written at t + delay / 2, in
order, so a request and its answer pay the whole ``delay`` once, as over a real link. With a bandwidth,
each direction is also a link that sends one chunk at a time at that rate, so a megabyte of logits costs
what it costs on a LAN. The proxy also counts round trips (each time the server starts answering after
the client spoke) and the bytes each way.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field


@dataclass
class DelayProxy:
    """``listen`` (a free loopback port) forwards to ``upstream`` (host:port) with ``delay_s`` per round trip
    and, if given, ``bits_per_s`` each way."""

    upstream: str
    delay_s: float
    bits_per_s: float | None = None
    round_trips: int = 0
    bytes_sent: dict[str, int] = field(default_factory=lambda: {"client": 0, "server": 0})  # by who spoke
    endpoint: str = ""
    _loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    def start(self) -> DelayProxy:
        ready = threading.Event()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
            self.endpoint = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
            ready.set()
            self._loop.run_forever()
            server.close()

        self._thread = threading.Thread(target=run, name=f"delay-proxy-{self.upstream}", daemon=True)
        self._thread.start()
        ready.wait()
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()

    async def _serve(self, client_reader, client_writer) -> None:
        host, _, port = self.upstream.rpartition(":")
        server_reader, server_writer = await asyncio.open_connection(host, int(port))
        last = ["client"]  # who spoke last on this connection

        async def pump(reader, writer, speaker: str) -> None:
            queue: asyncio.Queue = asyncio.Queue()

            async def deliver() -> None:
                while (item := await queue.get()) is not None:
                    due, data = item
                    if (wait := due - time.perf_counter()) > 0:
                        await asyncio.sleep(wait)
                    writer.write(data)
                    await writer.drain()
                writer.close()

            delivering = asyncio.ensure_future(deliver())
            link_free = 0.0  # when this direction's link has sent what it was given
            while data := await reader.read(1 << 16):
                if speaker == "server" and last[0] == "client":
                    self.round_trips += 1
                last[0] = speaker
                self.bytes_sent[speaker] += len(data)
                sent = time.perf_counter()
                if self.bits_per_s:
                    link_free = sent = max(sent, link_free) + len(data) * 8 / self.bits_per_s
                queue.put_nowait((sent + self.delay_s / 2, data))
            queue.put_nowait(None)
            await delivering

        try:
            await asyncio.gather(
                pump(client_reader, server_writer, "client"), pump(server_reader, client_writer, "server")
            )
        except (ConnectionError, OSError):
            client_writer.close()
            server_writer.close()
