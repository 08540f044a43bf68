"""`localspec serve`: run the API on the loaded engine with uvicorn until interrupted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import uvicorn

from localspec.app.config import Config
from localspec.serve.api import Api, ServeOptions, add_routes, create_app


def options_of(config: Config) -> ServeOptions:
    serve = config.serve
    return ServeOptions(api_key=serve.api_key, queue_limit=serve.queue_limit, max_body_bytes=serve.max_body_kb * 1024)


class _Server(uvicorn.Server):
    """Says where it listens once the socket is bound (with port 0, the port it got), and where the pair
    computes: the line to wait for."""

    def __init__(self, config: uvicorn.Config, computing: str) -> None:
        super().__init__(config)
        self.computing = computing

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started and self.servers:
            host, port = self.servers[0].sockets[0].getsockname()[:2]
            print(f"localspec API: http://{host}:{port}/v1 (OpenAI-compatible; {self.computing}; Ctrl-C stops)",
                  flush=True)  # fmt: skip


def run(engine, config: Config) -> None:
    app = create_app(engine, config, options_of(config))
    server = _Server(uvicorn.Config(app, host=config.serve.host, port=config.serve.port, log_level="warning",
                                    timeout_graceful_shutdown=5), engine.compute_line)  # fmt: skip
    server.run()


def mount(app, engine: Callable[[], Any], config: Config) -> None:
    """Add the API's routes to another FastAPI app (the UI's, for `localspec ui --api`): one engine, one copy
    of the weights."""
    add_routes(app, Api(engine, config, options_of(config)))  # engine: a callable giving the current one
