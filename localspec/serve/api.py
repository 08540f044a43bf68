"""`localspec serve`: an OpenAI-compatible HTTP API over the loaded pair, with every token's fate.

Editors, notebooks and chat front ends reach local models through the
OpenAI-style API. This one answers ``POST /v1/chat/completions`` (the
messages rendered with the model's chat template, through the same
:class:`~localspec.app.conversation.Conversation` the UI and terminal use),
``POST /v1/completions`` (a raw prompt), ``GET /v1/models`` and
``GET /health``. What no other server gives: every streamed chunk carries,
in its ``localspec`` field, the fate of each token in it (accepted /
corrected / bonus / target, with p, q and the acceptance probability), and
the last one the reply's draft statistics and measured speedup.

One generation at a time (llama.cpp contexts are not thread-safe): a
request waits its turn in arrival order (:class:`~localspec.serve.gate.Gate`)
in a worker thread, and a client that disconnects — while waiting or
mid-reply — cancels its generation within one step.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from localspec.app.config import Config
from localspec.app.conversation import Conversation, Turn
from localspec.core.errors import LocalspecError, PromptTooLongError, RpcServerError
from localspec.core.events import GenerationResult, StepEvent, TokenEvent
from localspec.serve.gate import Cancelled, Gate, QueueFull
from localspec.serve.requests import ApiError, ChatRequest, CompletionRequest, parse

FINISH = {"eos": "stop", "stop_string": "stop", "max_tokens": "length", "context_full": "length", "cancelled": "stop"}


@dataclass(frozen=True)
class ServeOptions:
    """How the server admits requests (from the ``serve`` config section)."""

    api_key: str = ""
    queue_limit: int = 8
    max_body_bytes: int = 1 << 20


class Api:
    """The engine behind the HTTP routes: admission, one generation at a time, chunks out."""

    def __init__(self, engine: Callable[[], Any], config: Config, options: ServeOptions) -> None:
        self._engine = engine  # the current engine (the UI may load another pair while serving)
        self.config = config
        self.options = options
        self.gate = Gate(options.queue_limit)
        self.model_id = config.model.pair or engine().target.name
        self.created = int(time.time())
        self._recent_s: list[float] = []

    @property
    def engine(self):
        return self._engine()

    # --- admission --------------------------------------------------------
    def check_auth(self, request: Request) -> None:
        if not self.options.api_key:
            return
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self.options.api_key.encode()):
            raise ApiError(401, "missing or wrong API key; send 'Authorization: Bearer <key>'", None,
                           "invalid_api_key", "authentication_error")  # fmt: skip

    async def body(self, request: Request) -> bytes:
        """The request body, refused with 413 beyond ``max_body_bytes`` (without reading all of it)."""
        limit = self.options.max_body_bytes
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise ApiError(413, f"the request body is {declared} bytes; the limit is {limit}", None, "body_too_large")
        data = bytearray()
        async for part in request.stream():
            data += part
            if len(data) > limit:
                raise ApiError(413, f"the request body exceeds {limit} bytes", None, "body_too_large")
        return bytes(data)

    def check_model(self, name: str | None) -> None:
        known = {self.model_id, self.engine.target.name, "localspec"}
        if name and name not in known:
            raise ApiError(404, f"model {name!r} is not loaded; this server has {self.model_id!r} (GET /v1/models)",
                           "model", "model_not_found")  # fmt: skip

    def retry_after(self) -> str:
        typical = sorted(self._recent_s)[len(self._recent_s) // 2] if self._recent_s else 5.0
        return str(max(1, round(typical * (self.gate.waiting + 1))))

    # --- one generation ---------------------------------------------------
    def generate(self, conversation: Conversation, config: Config, user: str, stops, cancel: threading.Event,
                 ticket: int, want_trace: bool) -> Iterator[dict[str, Any]]:  # fmt: skip
        """Wait for the turn, then yield ``{"text", "tokens", "step"}`` pieces and a final ``{"result"}``."""
        with self.gate.turn(ticket, cancel):
            started = time.perf_counter()
            pending: list[TokenEvent] = []
            try:
                for event in conversation.reply(self.engine, config, user, cancel, stop=stops):
                    if isinstance(event, TokenEvent):
                        pending.append(event)
                    elif isinstance(event, StepEvent):
                        yield _piece(pending, event)
                        pending = []
                    elif isinstance(event, GenerationResult):
                        if pending:
                            yield _piece(pending, None)
                        yield {
                            "result": event,
                            "turn": conversation.turns[-1],
                            "trace": self._save(conversation, config, want_trace),
                        }
            finally:
                self._recent_s = (self._recent_s + [time.perf_counter() - started])[-16:]
        turn = conversation.turns[-1] if conversation.turns else None
        if turn is not None and turn.trace is not None and turn.trace.error:
            if self.engine.lost_server() is not None:  # a machine holding the target's layers is down
                raise ApiError(503, turn.trace.error, None, "rpc_server_unavailable", "server_error")
            raise ApiError(500, f"generation failed: {turn.trace.error}", None, "generation_failed", "server_error")

    def _save(self, conversation: Conversation, config: Config, wanted: bool) -> str | None:
        if not wanted:
            return None
        folder = config.resolve_path(config.trace.dir)
        folder.mkdir(parents=True, exist_ok=True)
        path = Path(folder) / f"api-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}.jsonl"
        conversation.turns[-1].trace.save(path)
        return str(path)

    def speedup(self, result: GenerationResult, steps: list[dict[str, Any]]) -> float | None:
        """Against the target under the reply's own conditions (see Engine.target_seconds_during)."""
        t_target = self.engine.target_seconds_during(steps)
        stats = result.stats
        return stats.tokens_per_second * t_target if t_target and stats.drafted and stats.decode_s > 0 else None


def _piece(tokens: list[TokenEvent], step: StepEvent | None) -> dict[str, Any]:
    fates = [{"id": t.token_id, "text": t.text, "status": t.status.value, "p": t.p, "q": t.q,
              "accept_prob": t.accept_prob} for t in tokens]  # fmt: skip
    info = None
    if step is not None:
        info = {"step": step.step, "drafter": step.source or "none", "drafted": len(step.drafted),
                "accepted": step.n_accepted}  # fmt: skip
    return {"text": "".join(t.text for t in tokens), "tokens": fates, "step": info}


def conversation_of(messages) -> tuple[Conversation, str]:
    """The API's message list as a Conversation (optional system message, then user/assistant turns
    ending with the user's) and the last user message."""
    system = None
    rest = list(messages)
    if rest and rest[0].role in ("system", "developer"):
        system = rest.pop(0).text()
    if not rest or rest[-1].role != "user":
        raise ApiError(400, "the last message must be the user's", "messages")
    turns, expected = [], "user"
    for message in rest[:-1]:
        if message.role != expected:
            raise ApiError(400, f"messages must alternate user / assistant after one optional system message; "
                                f"got {message.role!r} where {expected!r} was expected", "messages")  # fmt: skip
        if expected == "user":
            turns.append(Turn(message.text()))
        else:
            turns[-1].answer = message.text()
        expected = "assistant" if expected == "user" else "user"
    return Conversation(system=system, turns=turns), rest[-1].text()


# ----------------------------------------------------------------------
def create_app(engine, config: Config, options: ServeOptions) -> FastAPI:
    """The FastAPI app (also mounted into the UI's server by ``localspec ui --api``)."""
    app = FastAPI(title="localspec", docs_url=None, redoc_url=None, openapi_url=None)
    add_routes(app, Api(lambda: engine, config, options))
    app.add_exception_handler(StarletteHTTPException, _route_errors)
    return app


async def _route_errors(request: Request, error: StarletteHTTPException) -> JSONResponse:
    """An unknown route or method answers in the API's own error shape (the standalone server; the UI's
    server, which mounts these routes, keeps its own pages)."""
    what = {404: f"no route {request.url.path}", 405: f"{request.method} is not allowed on {request.url.path}"}
    routes = "POST /v1/chat/completions, POST /v1/completions, GET /v1/models"
    message = f"{what.get(error.status_code, error.detail)}; the API serves {routes}"
    code = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code)
    return JSONResponse(ApiError(error.status_code, message, None, code).body(), status_code=error.status_code,
                        headers=getattr(error, "headers", None))  # fmt: skip


def _answers_errors(handler):
    """ApiError -> its OpenAI-style JSON (per route, so routes added to a running app answer the same)."""

    @functools.wraps(handler)
    async def wrapped(request: Request):
        try:
            return await handler(request)
        except ApiError as error:
            return JSONResponse(error.body(), status_code=error.status, headers=error.headers)
        except Exception as error:  # a bug must still answer JSON, and the server go on
            failed = ApiError(500, f"internal error: {type(error).__name__}: {error}", None, "internal_error")
            return JSONResponse(failed.body(), status_code=500)

    return wrapped


def add_routes(app: FastAPI, api: Api) -> None:
    """The API's routes on ``app``, ahead of the routes it already has (the UI's catch-alls)."""
    before = len(app.router.routes)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": api.model_id, "running": api.gate.running, "waiting": api.gate.waiting}

    @app.get("/v1/models")
    @_answers_errors
    async def models(request: Request) -> dict[str, Any]:
        api.check_auth(request)
        draft = api.engine.draft_model.name if api.engine.draft_model is not None else "none"
        return {"object": "list", "data": [{
            "id": api.model_id, "object": "model", "created": api.created, "owned_by": "localspec",
            "localspec": {"target": api.engine.target.name, "draft": draft},
        }]}  # fmt: skip

    @app.post("/v1/chat/completions")
    @_answers_errors
    async def chat(request: Request):
        api.check_auth(request)
        body = parse(ChatRequest, await api.body(request))
        conversation, user = conversation_of(body.messages)
        return await respond(api, request, body, conversation, user, "chat.completion", api.config)

    @app.post("/v1/completions")
    @_answers_errors
    async def completions(request: Request):
        api.check_auth(request)
        body = parse(CompletionRequest, await api.body(request))
        raw = api.config.with_overrides({"chat.chat_template": False})
        return await respond(api, request, body, Conversation(), body.prompt, "text_completion", raw)

    added = app.router.routes[before:]
    del app.router.routes[before:]
    app.router.routes[:0] = added


async def respond(api: Api, request: Request, body, conversation: Conversation, user: str, kind: str, base: Config):
    """Admit the request, run it in a worker thread, and answer as one JSON or as server-sent events."""
    api.check_model(body.model)
    config = body.config(base)
    stops = body.stops()
    try:
        prepared, _, _ = conversation.prompt(api.engine, config, user)
    except PromptTooLongError as error:
        raise ApiError(
            400, str(error), "messages" if kind == "chat.completion" else "prompt", "context_length_exceeded"
        ) from None
    del prepared
    try:
        ticket = api.gate.ticket()
    except QueueFull as full:
        raise ApiError(503, f"the server is busy ({full.waiting} requests waiting); retry later", None,
                       "queue_full", "server_error", {"Retry-After": api.retry_after()}) from None  # fmt: skip
    cancel = threading.Event()
    pieces = _run_in_thread(
        lambda: api.generate(conversation, config, user, stops, cancel, ticket, body.trace), cancel, api.gate
    )
    ident = f"{'chatcmpl' if kind == 'chat.completion' else 'cmpl'}-{uuid.uuid4().hex[:24]}"
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        # a client that disconnects makes Starlette close this stream, whose cleanup sets ``cancel``
        return StreamingResponse(_sse(api, kind, ident, pieces, include_usage), media_type="text/event-stream")
    watcher = asyncio.ensure_future(_watch_disconnect(request, cancel, api.gate))
    try:
        text, fates, result, trace_path, steps = [], [], None, None, []
        async for piece in pieces:
            if "result" in piece:
                result, trace_path, steps = piece["result"], piece["trace"], _steps_of(piece)
            else:
                text.append(piece["text"])
                fates += piece["tokens"]
    finally:
        watcher.cancel()
    if result is None:
        raise ApiError(499, "the client closed the request", None, "cancelled")
    message = {"role": "assistant", "content": "".join(text)}
    choice = {"index": 0, "finish_reason": FINISH.get(result.stop_reason, "stop")}
    choice |= {"message": message} if kind == "chat.completion" else {"text": message["content"]}
    return {
        "id": ident, "object": kind, "created": int(time.time()), "model": api.model_id, "choices": [choice],
        "usage": _usage(result), "localspec": _summary(api, result, trace_path, steps) | {"tokens": fates},
    }  # fmt: skip


def _usage(result: GenerationResult) -> dict[str, int]:
    prompt, completion = result.stats.n_prompt, len(result.token_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _steps_of(piece: dict[str, Any]) -> list[dict[str, Any]]:
    """The steps of the reply a result piece ends (its turn's trace)."""
    turn = piece.get("turn")
    return turn.trace.steps if turn is not None and turn.trace is not None else []


def _summary(api: Api, result: GenerationResult, trace_path: str | None, steps: list[dict[str, Any]]) -> dict[str, Any]:
    stats = result.stats
    out = {
        "stop_reason": result.stop_reason, "mode": stats.mode, "drafter": stats.drafter,
        "drafted": stats.drafted, "accepted": stats.accepted, "acceptance_rate": stats.acceptance_rate,
        "tokens_per_step": stats.tokens_per_step, "tokens_per_second": stats.tokens_per_second,
        "speedup": api.speedup(result, steps), "steps_by_source": stats.steps_by_source(),
    }  # fmt: skip
    if result.stop_reason == "context_full":
        out["note"] = "the context is full: the reply was cut (finish_reason length)"
    if trace_path:
        out["trace"] = trace_path
    return out


async def _sse(api: Api, kind: str, ident: str, pieces: AsyncIterator[dict], include_usage: bool) -> AsyncIterator[str]:
    created = int(time.time())

    def chunk(choice: dict | None, extra: dict | None = None) -> str:
        data = {"id": ident, "object": f"{kind}.chunk" if kind == "chat.completion" else kind, "created": created,
                "model": api.model_id, "choices": [choice] if choice else []} | (extra or {})  # fmt: skip
        return f"data: {json.dumps(data)}\n\n"

    def choice_of(text: str, finish: str | None, first: bool = False) -> dict:
        if kind == "chat.completion":
            delta = {"role": "assistant", "content": text} if first else {"content": text}
            return {"index": 0, "delta": delta, "finish_reason": finish}
        return {"index": 0, "text": text, "finish_reason": finish}

    first = True
    try:
        async for piece in pieces:
            if "result" in piece:
                result = piece["result"]
                yield chunk(
                    choice_of("", FINISH.get(result.stop_reason, "stop")),
                    {"localspec": _summary(api, result, piece["trace"], _steps_of(piece))},
                )
                if include_usage:
                    yield chunk(None, {"usage": _usage(result)})
                break
            yield chunk(
                choice_of(piece["text"], None, first), {"localspec": {"tokens": piece["tokens"], "step": piece["step"]}}
            )
            first = False
    except ApiError as error:  # the status line is sent: the error goes in the stream, as OpenAI does
        yield f"data: {json.dumps(error.body())}\n\n"
    yield "data: [DONE]\n\n"


def _run_in_thread(produce: Callable[[], Iterator[dict]], cancel: threading.Event, gate: Gate) -> AsyncIterator[dict]:
    """Run the blocking generator in its own thread; hand its items to the event loop as they come."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    def worker() -> None:
        try:
            for item in produce():
                loop.call_soon_threadsafe(queue.put_nowait, item)
        except Cancelled:
            pass
        except BaseException as error:  # noqa: BLE001 - handed to the request that owns it
            loop.call_soon_threadsafe(queue.put_nowait, error)
        finally:
            loop.call_soon_threadsafe(queue.put_nowait, done)

    threading.Thread(target=worker, name="localspec-generate", daemon=True).start()

    async def items() -> AsyncIterator[dict]:
        try:
            while (item := await queue.get()) is not done:
                if isinstance(item, ApiError):
                    raise item
                if isinstance(item, RpcServerError):  # a machine holding the target's layers is down
                    raise ApiError(503, str(item), None, "rpc_server_unavailable", "server_error")
                if isinstance(item, LocalspecError):
                    raise ApiError(400, str(item))
                if isinstance(item, BaseException):
                    raise ApiError(500, f"internal error: {item}", None, "internal_error", "server_error")
                yield item
        finally:
            cancel.set()  # a consumer that stops early (a client gone) ends the generation
            gate.wake()

    return items()


async def _watch_disconnect(request: Request, cancel: threading.Event, gate: Gate) -> None:
    """Set ``cancel`` when the client disconnects (the body is read, so the next message says so)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            cancel.set()
            gate.wake()
            return
