"""The Gradio desktop chat with live token fates, and the acceptance debugging view: the page's layout.

``launch(config)`` is what ``localspec ui`` calls (entry point
``localspec.frontends:ui``). The handlers are :class:`~localspec.ui.handlers.ChatApp`'s
plain methods; :func:`build` only lays out the components and wires them.

One generation at a time: every event that touches the llama contexts shares
the Gradio concurrency group ``"engine"`` with a limit of one (and the engine
holds its own lock). A second tab's message is shown at once with a
"waiting for the other conversation" bubble while its request queues.
"""

from __future__ import annotations

import os

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"  # before gradio is imported: no telemetry, no version check

import inspect  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any  # noqa: E402

import gradio as gr  # noqa: E402  (handlers' gr.Request annotations are resolved from module globals)

from localspec.app.config import Config, describe  # noqa: E402
from localspec.core.errors import LocalspecError  # noqa: E402

from . import debug_view as dv  # noqa: E402
from .handlers import STREAM_INTERVAL_S, ChatApp, ChatState, allowed_paths, model_choices  # noqa: E402
from .render import legend, notice_html, render_conversation, stats_html  # noqa: E402
from .session import PANEL, Session, Settings  # noqa: E402
from .theme import EARLY_JS, STREAM_JS  # noqa: E402

# ----------------------------------------------------------------------
# How the settings panel lays out its controls (rows of config keys); what each control is —
# dropdown, checkbox, slider or number box, its range, choices and help — comes from the declaration.
PANEL_ROWS = (
    ("speculative.mode",),
    ("sampling.temperature",),
    ("speculative.draft_tokens",),
    ("speculative.adaptive",),
    ("sampling.top_k", "sampling.top_p", "sampling.min_p"),
    ("sampling.seed", "sampling.max_tokens"),
    ("chat.system_prompt",),
)
SLIDER_STEPS = {"sampling.temperature": 0.05, "speculative.draft_tokens": 1}


def control(key: str, value: Any):
    """The Gradio control of one setting, generated from its declaration."""
    info = describe(key)
    common = dict(label=PANEL[key], info=info.help, elem_id="ls-" + info.name.replace("_", "-"))
    if info.choices:
        return gr.Dropdown(list(info.choices), value=value, **common)
    if info.kind == "bool":
        return gr.Checkbox(value, **common)
    if key in SLIDER_STEPS:
        return gr.Slider(info.lo, info.hi, value=value, step=SLIDER_STEPS[key], **common)
    if info.kind in ("int", "float"):
        return gr.Number(value, minimum=info.lo, maximum=info.hi, precision=0 if info.kind == "int" else None, **common)
    return gr.Textbox(value, lines=2, **common)


@dataclass
class _Chat:
    """The chat tab's components (what the events are wired to)."""

    chat: Any
    notice: Any
    message: Any
    send: Any
    stop: Any
    regenerate: Any
    clear: Any
    stats: Any
    settings: list[Any]
    target: Any
    draft: Any
    load: Any
    stream: Any  # takes a streaming reply's updates and applies them to the page (ui/theme.py: STREAM_JS)


@dataclass
class _Debug:
    """The debugging tab's components."""

    summary: Any
    save: Any
    upload: Any
    replay: Any
    saved_file: Any
    notice: Any
    replay_box: Any
    plots: list[Any]
    table: Any
    token_pick: Any
    top: Any

    @property
    def outputs(self) -> list[Any]:
        return [self.summary, self.table, *self.plots, self.token_pick, self.top]


def build(app: ChatApp, startup_notice: str = ""):
    """Wire :class:`ChatApp` to Gradio components. Returns the ``gr.Blocks``."""
    with gr.Blocks(title="localspec — speculative decoding, token by token", analytics_enabled=False) as demo:
        state, pending = gr.State(ChatState()), gr.State("")
        with gr.Row(elem_id="ls-header-row"):
            gr.HTML(
                '<div id="ls-header"><div class="ls-title">local<span>spec</span></div>'
                '<div class="ls-sub">exact speculative decoding — every token shows its fate</div></div>'
            )
            badge = gr.HTML(app.badge(), elem_id="ls-badge-box")
        with gr.Tabs() as tabs:
            with gr.Tab("Chat", id="chat", elem_id="ls-tab-chat"):
                chat = _chat_tab(app, startup_notice)
            with gr.Tab("Debugging", id="debug", elem_id="ls-tab-debug"):
                debug = _debug_tab()
        token_click = gr.Textbox(visible="hidden", elem_id="ls-token-pick")
        _wire_chat(app, chat, debug, state, pending, badge)
        _wire_debug(app, debug, state, tabs, token_click)
        _api_endpoint(app, chat)
    return demo


def _chat_tab(app: ChatApp, startup_notice: str) -> _Chat:
    config = app.session.config
    defaults = Settings.from_config(config).values
    targets, drafts = model_choices(config)
    with gr.Row(equal_height=False):
        with gr.Column(scale=3, min_width=480):
            gr.HTML(legend())
            chat = gr.HTML(render_conversation([]), elem_id="ls-chat", autoscroll=True)
            stream_js = STREAM_JS.replace("STREAM_INTERVAL_MS", str(round(STREAM_INTERVAL_S * 1000)))
            stream = gr.HTML("", html_template="", js_on_load=stream_js, elem_id="ls-stream")
            notice = gr.HTML(startup_notice, elem_id="ls-notice")
            with gr.Row(equal_height=True):
                message = gr.Textbox(placeholder="Message the target model…  (Enter to send)", show_label=False,
                                     scale=8, lines=1, max_lines=8, autofocus=True, elem_id="ls-message")  # fmt: skip
                send = gr.Button("Send", variant="primary", scale=1, min_width=80, elem_id="ls-send")
                stop = gr.Button("Stop", variant="stop", scale=1, min_width=80, elem_id="ls-stop")
            with gr.Row():
                regenerate = gr.Button("↻ Regenerate", size="sm", elem_id="ls-regenerate")
                clear = gr.Button("Clear chat", size="sm", elem_id="ls-clear")
        with gr.Column(scale=1, min_width=300):
            stats = gr.HTML(stats_html(None), elem_id="ls-stats-box")
            controls: dict[str, Any] = {}
            with gr.Accordion("Sampling & speculation", open=True):
                for row in PANEL_ROWS:
                    if len(row) == 1:
                        controls[row[0]] = control(row[0], defaults[row[0]])
                        continue
                    with gr.Row():
                        controls.update({key: control(key, defaults[key]) for key in row})
            with gr.Accordion("Model pair", open=False):
                target = gr.Dropdown(targets, value=targets[0], label="target (.gguf)", allow_custom_value=True)
                draft = gr.Dropdown(
                    drafts, value=drafts[0], label="draft (.gguf, ngram, none)", allow_custom_value=True
                )
                load = gr.Button("Load pair", elem_id="ls-load-pair")
    settings = [controls[key] for key in PANEL]  # the order Settings.from_panel reads
    return _Chat(chat, notice, message, send, stop, regenerate, clear, stats, settings, target, draft, load, stream)


def serve_early_script(server_app, script: str) -> None:
    """Put ``script`` first in the head of the page Gradio serves, so it runs before Gradio's own modules
    (the ``head`` HTML given to Gradio is added by those modules, after they ran)."""
    tag = f"<script>{script}</script>".encode()
    for route in server_app.router.routes:
        if getattr(route, "path", None) == "/" and "GET" in (getattr(route, "methods", None) or ()):
            route.app = _inserting_after_head(route.app, tag)


def _inserting_after_head(asgi, tag: bytes):
    """An ASGI app answering as ``asgi`` does, with ``tag`` inserted after the first ``<head>``."""

    async def answer(scope, receive, send) -> None:
        started: dict = {}
        body: list[bytes] = []

        async def rewritten(message) -> None:
            if message["type"] == "http.response.start":
                started.update(message)
                return
            body.append(message.get("body", b""))
            if message.get("more_body"):
                return
            page = b"".join(body).replace(b"<head>", b"<head>" + tag, 1)
            headers = [(k, v) for k, v in started.get("headers", []) if k.lower() != b"content-length"]
            await send({**started, "headers": [*headers, (b"content-length", str(len(page)).encode())]})
            await send({"type": "http.response.body", "body": page})

        await asgi(scope, receive, rewritten)

    return answer


def add_stream_routes(server_app, app: ChatApp) -> None:
    """What the page reads outside Gradio's events while a reply streams (its tokens and stats) and asks when a
    token is hovered (its evidence), as plain routes beside Gradio's. A Gradio event, server functions
    included, marks its component pending while it runs, and Gradio's status tracker then runs a timer
    every frame: with an update always outstanding the page drew 60 frames a second for the whole reply."""
    from fastapi.responses import PlainTextResponse, StreamingResponse

    @server_app.get("/localspec/stream")
    def stream(reply: str = "") -> StreamingResponse:
        # a proxy in front must pass each line on as it comes (nginx buffers unless told not to)
        return StreamingResponse(app.updates(reply), media_type="application/x-ndjson",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})  # fmt: skip

    @server_app.get("/localspec/evidence")
    def evidence(at: str = "") -> PlainTextResponse:
        return PlainTextResponse(app.evidence(at))


def _debug_tab() -> _Debug:
    summary = gr.HTML(dv.summary_html(None), elem_id="ls-summary")
    with gr.Row():
        save = gr.Button("Save trace (.jsonl)", size="sm", elem_id="ls-save-trace")
        upload = gr.UploadButton("Load trace (.jsonl)", size="sm", file_types=[".jsonl", ".json", ".txt"],
                                 type="filepath", elem_id="ls-load-trace")  # fmt: skip
        replay = gr.Button("Replay without draft", size="sm", elem_id="ls-replay")
    saved_file = gr.File(label="saved trace — attach it to a bug report; `Load trace` reads it back",
                         interactive=False, visible=False, elem_id="ls-saved-file")  # fmt: skip
    notice = gr.HTML("", elem_id="ls-debug-notice")
    replay_box = gr.HTML(dv.replay_html(None), elem_id="ls-replay-box")
    with gr.Row():
        plots = [gr.Plot(draw(None), show_label=False)
                 for draw in (dv.acceptance_by_position_plot, dv.running_acceptance_plot,
                              dv.timeline_plot)]  # fmt: skip
    with gr.Row(equal_height=False):
        with gr.Column(scale=3):
            table = gr.Dataframe(headers=dv.STEP_COLUMNS, value=[], label="verified positions, step by step",
                                 interactive=False, wrap=True, max_height=420, elem_id="ls-steps")  # fmt: skip
        with gr.Column(scale=2):
            token_pick = gr.Dropdown([], label="token", elem_id="ls-token-dropdown", type="value")
            top = gr.HTML(dv.top_table_html(None, None), elem_id="ls-top")
    return _Debug(summary, save, upload, replay, saved_file, notice, replay_box, plots, table, token_pick, top)


def _refresh(app: ChatApp):
    def refresh(st):
        summary_html, rows, f1, f2, f3, choices, selected, top_html = app.debug_outputs(st)
        return summary_html, rows, f1, f2, f3, gr.update(choices=choices, value=selected), top_html

    return refresh


def _wire_chat(app: ChatApp, ui: _Chat, debug: _Debug, state, pending, badge) -> None:
    """Send / Enter, Stop, Regenerate, Clear and Load pair. Everything touching the models queues on "engine"."""
    refresh = _refresh(app)

    def respond(msg, st, *values_and_request):
        *values, request = values_and_request
        for update in app.respond(msg, st, Settings.from_panel(*values), _key(request), every=None):
            yield tuple(gr.skip() if value is None else value for value in update)

    _takes_request(respond, 2 + len(ui.settings))

    def queue_message(msg, st, request: gr.Request):
        return app.queue_message(msg, st, _key(request))

    def pop_for_regenerate(st, request: gr.Request):
        return app.pop_for_regenerate(st, _key(request))

    def stop_reply(request: gr.Request) -> None:
        app.stop(_key(request))

    outputs = [ui.chat, ui.stats, ui.notice, state, ui.message, ui.stream]
    # no progress anywhere: a pending component runs a timer every frame for the whole reply (the page drew
    # 60 frames a second, and on shared cores the model paid for it); a State has no tracker to run
    generate = dict(concurrency_limit=1, concurrency_id="engine", show_progress="hidden", show_progress_on=[state],
                    api_name=False)  # fmt: skip
    for trigger in (ui.message.submit, ui.send.click):
        (
            trigger(
                queue_message, [ui.message, state], [ui.message, ui.chat, pending], queue=False, show_progress="hidden"
            )
            .then(respond, [pending, state, *ui.settings], outputs, **generate)
            .then(refresh, [state], debug.outputs, show_progress="hidden", api_name=False)
        )
    ui.stop.click(stop_reply, None, None, queue=False, api_name=False)
    ui.regenerate.click(pop_for_regenerate, [state], [pending, state, ui.chat], queue=False, api_name=False).then(
        respond, [pending, state, *ui.settings], outputs, **generate
    ).then(refresh, [state], debug.outputs, show_progress="hidden", api_name=False)
    ui.clear.click(app.clear, None, [state, ui.chat, ui.stats, ui.notice], queue=False, api_name=False).then(
        refresh, [state], debug.outputs, api_name=False
    )
    ui.load.click(app.load_pair, [ui.target, ui.draft], [ui.notice, badge], concurrency_limit=1,
                  concurrency_id="engine", api_name=False)  # fmt: skip


def _wire_debug(app: ChatApp, debug: _Debug, state, tabs, token_click) -> None:
    """Token picks (from the dropdown or a click in the chat), save, load and replay."""
    refresh = _refresh(app)

    def save_trace(st):
        path, notice_box = app.save_trace(st)
        return gr.update(value=path, visible=path is not None), notice_box

    debug.token_pick.input(app.select_token, [state, debug.token_pick], [state, debug.top], api_name=False)
    token_click.change(app.pick_from_chat, [token_click, state], [state], api_name=False).then(
        refresh, [state], debug.outputs, api_name=False
    ).then(lambda: gr.Tabs(selected="debug"), None, [tabs], api_name=False)
    debug.save.click(save_trace, [state], [debug.saved_file, debug.notice], api_name=False)
    debug.upload.upload(app.load_trace, [debug.upload, state], [state, debug.notice], api_name=False).then(
        refresh, [state], debug.outputs, api_name=False
    )
    debug.replay.click(lambda st: app.replay(st)[0], [state], [debug.replay_box], concurrency_limit=1,
                       concurrency_id="engine", api_name=False)  # fmt: skip


def _api_endpoint(app: ChatApp, ui: _Chat) -> None:
    """One programmatic endpoint for scripts and the end-to-end test: message + settings in, streamed
    (chat html, stats html, notice html) out. State stays in the caller's session."""
    api_box = gr.Textbox(visible="hidden")

    def api_chat(msg, *values_and_request):
        *values, request = values_and_request
        app.new_request(_key(request))
        state, stats, notice = ChatState(), "", ""
        for update in app.respond(msg, state, Settings.from_panel(*values), _key(request), every=STREAM_INTERVAL_S):
            stats = stats if update.stats is None else update.stats
            notice = notice if update.notice is None else update.notice
            yield update.chat or render_conversation(state.turns), stats, notice  # the whole chat, each time

    _takes_request(api_chat, 1 + len(ui.settings))
    api_box.submit(api_chat, [api_box, *ui.settings], [ui.chat, ui.stats, ui.notice], concurrency_limit=1,
                   concurrency_id="engine", api_name="chat")  # fmt: skip

    def api_stop(request: gr.Request) -> None:  # what the Stop button does, for the caller's own reply
        app.stop(_key(request))

    api_stop_button = gr.Button(visible=False)
    api_stop_button.click(api_stop, None, None, queue=False, api_name="stop")


def _takes_request(handler: Callable, n_inputs: int) -> None:
    """Declare ``handler(*inputs, request)`` as ``n_inputs`` plain parameters and a ``gr.Request`` one:
    Gradio maps inputs by signature and injects the request by annotation, and these handlers take
    the settings panel as ``*values`` so that it is listed once (:data:`ui.session.PANEL`)."""
    parameters = [inspect.Parameter(f"input_{i}", inspect.Parameter.POSITIONAL_OR_KEYWORD) for i in range(n_inputs)]
    parameters.append(inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=gr.Request))
    handler.__signature__ = inspect.Signature(parameters)
    handler.__annotations__ = {"request": gr.Request}


def _key(request: Any) -> str:
    return getattr(request, "session_hash", None) or "default"


def launch(config: Config, api: Callable[..., None] | None = None) -> None:
    """Start the UI on ``config.ui.host:config.ui.port`` and block until interrupted.

    ``api``: the API front end's mount (``localspec ui --api``), given the UI's server app and the
    session's current engine, so the OpenAI-style API and the chat share one loaded pair."""
    from .theme import CSS, HEAD

    session = Session(config)
    startup_notice, load_error = "", ""
    try:
        warning = session.engine.pair_warning()  # load now: the first message is fast, a bad pair is reported
        startup_notice = notice_html(warning) if warning else ""
    except LocalspecError as error:
        load_error = f"{error}"
        startup_notice = notice_html(f"{error} — fix the pair under “Model pair” and press Load pair")
    app = ChatApp(session)
    demo = build(app, startup_notice)
    demo.queue(default_concurrency_limit=4)
    host, port = config.ui.host, config.ui.port
    theme = gr.themes.Soft(
        primary_hue="emerald",
        neutral_hue="slate",
        font=["ui-sans-serif", "system-ui", "-apple-system", "Segoe UI", "sans-serif"],
        font_mono=["ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "monospace"],
    )
    try:
        demo.launch(
            server_name=host,
            server_port=port,
            share=False,
            inbrowser=False,
            quiet=True,
            show_error=True,
            ssr_mode=False,
            mcp_server=False,
            enable_monitoring=False,
            footer_links=[],
            theme=theme,
            css=CSS,
            head=HEAD,
            prevent_thread_lock=True,
            allowed_paths=allowed_paths(config),
        )
        serve_early_script(demo.server_app, EARLY_JS)
        add_stream_routes(demo.server_app, app)
        if api is not None:
            api(demo.server_app, lambda: session.engine, config)
            print(f"localspec API: http://{host}:{port}/v1 (OpenAI-compatible, sharing the UI's models)", flush=True)
        # printed once the server answers: scripts (and the tests) wait for this line, not for a clock
        if load_error:  # the page says it too; whoever started the UI from a terminal reads it here first
            print(f"the pair did not load: {load_error} (the page's Model pair panel loads another)", file=sys.stderr,
                  flush=True)  # fmt: skip
        computing = f"; {session.engine.compute_line}" if session.loaded else ""
        print(f"localspec UI: http://{host}:{port}  (pair: {session.pair_name}{computing}; Ctrl-C to stop)", flush=True)
        demo.block_thread()
    finally:
        session.close()
