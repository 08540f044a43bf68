"""The Gradio desktop chat with live token fates, and the acceptance debugging view.

``launch(config)`` is what ``localspec ui`` calls (entry point
``localspec.frontends:ui``). :class:`ChatApp` holds every handler as a plain
method — values in, values out — so the tests drive them against the real
engine without a browser; :func:`build` only wires them to components.

One generation at a time: every event that touches the llama contexts shares
the Gradio concurrency group ``"engine"`` with a limit of one (and the engine
holds its own lock). A second tab's message is shown at once with a
"waiting for the other conversation" bubble while its request queues.
"""

from __future__ import annotations

import os

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"  # before gradio is imported: no telemetry, no version check

import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Iterator  # noqa: E402

import gradio as gr  # noqa: E402  (handlers' gr.Request annotations are resolved from module globals)

from localspec.app.catalog import user_models_dir  # noqa: E402
from localspec.app.config import PROJECT_ROOT, Config  # noqa: E402
from localspec.app.conversation import Conversation, Turn  # noqa: E402
from localspec.app.trace import Trace  # noqa: E402
from localspec.core.errors import LocalspecError  # noqa: E402
from localspec.core.modes import MODES  # noqa: E402

from . import debug_view as dv  # noqa: E402
from .render import legend, notice_html, render_conversation, stats_html  # noqa: E402
from .session import ReplayReport, Session, Settings, speed_of, timestamped_trace_path  # noqa: E402

STREAM_INTERVAL_S = 0.06  # at most ~16 screen updates a second while streaming


@dataclass
class ChatState:
    """Per-tab state (a ``gr.State``): the conversation and what the debugging tab shows."""

    conversation: Conversation = field(default_factory=Conversation)
    view: Trace | None = None  # the reply in the debugging tab: the latest one or a loaded trace
    selected: int | None = None  # token index selected in the debugging tab

    @property
    def turns(self) -> list[Turn]:
        return self.conversation.turns


class ChatApp:
    """All handlers. ``key`` identifies a browser tab (Gradio's session hash) for the stop button."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._cancels: dict[str, threading.Event] = {}
        self._busy = threading.Event()

    # --- chat ------------------------------------------------------------
    def queue_message(self, message: str, state: ChatState, key: str = "default") -> tuple[str, str, str]:
        """Show the user's message at once (and say so when another tab is generating).

        Runs outside the queue when the user sends, so it is where a new request
        begins: an older Stop is forgotten here, and a Stop pressed from now on —
        even while the request still waits in the queue — cancels this one.
        """
        self.new_request(key)
        message = (message or "").strip()
        if not message:
            return "", render_conversation(state.turns), ""
        return "", render_conversation(state.turns, pending=message, busy=self._busy.is_set()), message

    def respond(
        self, message: str, state: ChatState, settings: Settings, key: str = "default"
    ) -> Iterator[tuple[str, str, str, ChatState, str]]:
        """Stream a reply. Yields (chat html, stats html, notice html, state, textbox value)."""
        message = (message or "").strip()
        if not message:
            yield render_conversation(state.turns), self._stats(state), "", state, ""
            return
        cancel = self._cancel_event(key)
        if cancel.is_set():  # Stop was pressed while this request waited in the queue
            notice = notice_html("stopped before the reply began — your message is back in the box", "info")
            yield render_conversation(state.turns), self._stats(state), notice, state, message
            return
        self._busy.set()
        try:
            try:
                config = settings.apply(self.session.config)
                events = state.conversation.reply(self.session.engine, config, message, cancel, config.trace.top_n)
                next(events, None)  # settings, prompt and model errors surface here, before the turn is added
            except LocalspecError as error:
                yield render_conversation(state.turns), self._stats(state), notice_html(str(error)), state, message
                return
            trace = state.turns[-1].trace
            state.view, state.selected = trace, None
            info = notice_html(trace.notice, "info") if trace.notice else ""
            last = 0.0
            for _event in events:
                now = time.perf_counter()
                if trace.result is None and now - last < STREAM_INTERVAL_S:
                    continue
                last = now
                yield render_conversation(state.turns), self._stats(state), info, state, ""
            notice = notice_html(trace.error) if trace.error else info
            yield render_conversation(state.turns), self._stats(state), notice, state, ""
        finally:
            self._busy.clear()

    def stop(self, key: str = "default") -> None:
        """Ask this tab's generation to stop (the loop ends within one step), or its queued one not to start."""
        self._cancel_event(key).set()

    def new_request(self, key: str = "default") -> None:
        """This tab sent a new request: an older Stop is forgotten; one pressed from now on cancels it."""
        self._cancel_event(key).clear()

    def _cancel_event(self, key: str) -> threading.Event:
        return self._cancels.setdefault(key, threading.Event())

    def pop_for_regenerate(self, state: ChatState, key: str = "default") -> tuple[str, ChatState, str]:
        """Drop the last reply and return its user message to be sent again (a new request, like a send)."""
        self.new_request(key)
        last = state.conversation.pop()
        if last is None:
            return "", state, render_conversation(state.turns)
        return last.user, state, render_conversation(state.turns, pending=last.user, busy=self._busy.is_set())

    def clear(self) -> tuple[ChatState, str, str, str]:
        return ChatState(), render_conversation([]), self._stats(ChatState()), ""

    def _stats(self, state: ChatState) -> str:
        trace = state.turns[-1].trace if state.turns else None
        return stats_html(speed_of(trace, self.session.target_token_seconds()) if trace is not None else None)

    # --- model pair --------------------------------------------------------
    def load_pair(self, target: str, draft: str) -> tuple[str, str]:
        """(notice html, header badge). On any error the previous pair stays loaded and usable."""
        try:
            name = self.session.load_pair(target, draft)
        except LocalspecError as error:
            keep = f" — still using {self.session.pair_name}" if self.session.loaded else ""
            return notice_html(f"{error}{keep}"), self.badge()
        warning = self.session.engine.pair_warning()
        if warning:
            return notice_html(f"loaded {name} — {warning}"), self.badge()
        return notice_html(f"loaded {name}", "ok"), self.badge()

    def badge(self) -> str:
        return f'<span class="ls-badge" id="ls-pair-badge">{_escape(self.session.pair_name)}</span>'

    # --- debugging view ------------------------------------------------------
    def debug_outputs(self, state: ChatState) -> tuple[Any, ...]:
        """summary, step table rows, three plots, token choices, selected token, top-10 html."""
        run = state.view
        choices = dv.token_choices(run)
        selected = state.selected if state.selected is not None and run is not None and state.selected < len(run.tokens) else None
        if selected is None and run is not None:
            selected = _first_interesting(run)
        return (
            dv.summary_html(run),
            dv.step_rows(run) if run is not None else [],
            dv.acceptance_by_position_plot(run),
            dv.running_acceptance_plot(run),
            dv.timeline_plot(run),
            choices,
            selected,
            dv.top_table_html(run, selected),
        )

    def select_token(self, state: ChatState, index: Any) -> tuple[ChatState, str]:
        state.selected = int(index) if index not in (None, "") else None
        return state, dv.top_table_html(state.view, state.selected)

    def pick_from_chat(self, value: str, state: ChatState) -> ChatState:
        """A click on a token in the chat ("turn:index:nonce"): show that reply and token."""
        try:
            turn, index = (int(part) for part in (value or "").split(":")[:2])
            run = state.turns[turn].trace
        except (ValueError, IndexError):
            return state
        if run is not None:
            state.view, state.selected = run, index
        return state

    def save_trace(self, state: ChatState) -> tuple[str | None, str]:
        """Write the viewed run as JSONL (same format as ``generate --trace``); (file path, notice)."""
        if state.view is None:
            return None, notice_html("nothing to save yet: chat first or load a trace")
        folder = trace_folder(self.session.config)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = state.view.save(timestamped_trace_path(folder))
        except (OSError, LocalspecError) as error:
            path = state.view.save(Path(tempfile.mkdtemp(prefix="localspec-")) / "trace.jsonl")
            return str(path), notice_html(f"could not write to {folder} ({error}); saved to {path}", "info")
        return str(path), notice_html(f"saved {path}", "ok")

    def load_trace(self, path: str | None, state: ChatState) -> tuple[ChatState, str]:
        if not path:
            return state, ""
        try:
            state.view, state.selected = Trace.load(path), None
        except LocalspecError as error:
            return state, notice_html(f"{Path(path).name}: {error}")
        except (OSError, UnicodeDecodeError, ValueError) as error:
            return state, notice_html(f"{Path(path).name} cannot be read ({error}); choose a .jsonl trace")
        return state, notice_html(f"loaded trace {Path(path).name}", "ok")

    def replay(self, state: ChatState) -> tuple[str, ReplayReport | None]:
        """'Replay without draft' for the viewed run: (html verdict, report)."""
        if state.view is None:
            return dv.replay_html(None, "nothing to replay: generate a reply in invariant mode first"), None
        try:
            report = self.session.replay_without_draft(state.view)
        except LocalspecError as error:
            return dv.replay_html(None, str(error)), None
        return dv.replay_html(report), report


def _escape(text: str) -> str:
    import html

    return html.escape(text)


def _first_interesting(run: Trace) -> int | None:
    """Default token for the top-10 view: the first correction, else the first token."""
    for i, token in enumerate(run.tokens):
        if token.get("status") == "corrected":
            return i
    return 0 if run.tokens else None


def model_choices(config: Config) -> tuple[list[str], list[str]]:
    """GGUF files in the models folder and models/ (plus the configured ones) for the pair pickers."""
    folders = dict.fromkeys([user_models_dir(), PROJECT_ROOT / "models"])
    found = sorted(str(p) for folder in folders for p in folder.glob("*.gguf"))
    configured = [str(config.resolve_path(v)) if v.lower() not in ("ngram", "none") else v
                  for v in (config.model.target, config.model.draft)]  # fmt: skip
    targets = list(dict.fromkeys([configured[0], *found]))
    drafts = list(dict.fromkeys([configured[1], *found, "ngram", "none"]))
    return targets, drafts


def trace_folder(config: Config) -> Path:
    """Where the UI saves traces (``trace.dir``, resolved like every configured path)."""
    return config.resolve_path(config.trace.dir)


def allowed_paths(config: Config) -> list[str]:
    """Folders Gradio may serve files from besides the working directory: saved traces, wherever
    the UI was started from, and the fallback temporary folder."""
    return [str(trace_folder(config)), tempfile.gettempdir()]


# ----------------------------------------------------------------------
def build(app: ChatApp, startup_notice: str = ""):
    """Wire :class:`ChatApp` to Gradio components. Returns the ``gr.Blocks``."""
    config = app.session.config
    defaults = Settings.from_config(config)
    targets, drafts = model_choices(config)

    with gr.Blocks(title="localspec — speculative decoding, token by token", analytics_enabled=False) as demo:
        state = gr.State(ChatState())
        pending = gr.State("")
        with gr.Row(elem_id="ls-header-row"):
            gr.HTML(
                '<div id="ls-header"><div class="ls-title">local<span>spec</span></div>'
                '<div class="ls-sub">exact speculative decoding — every token shows its fate</div></div>'
            )
            badge = gr.HTML(app.badge(), elem_id="ls-badge-box")
        with gr.Tabs() as tabs:
            with gr.Tab("Chat", id="chat", elem_id="ls-tab-chat"):
                with gr.Row(equal_height=False):
                    with gr.Column(scale=3, min_width=480):
                        gr.HTML(legend())
                        chat = gr.HTML(render_conversation([]), elem_id="ls-chat", autoscroll=True)
                        notice = gr.HTML(startup_notice, elem_id="ls-notice")
                        with gr.Row(equal_height=True):
                            message = gr.Textbox(placeholder="Message the target model…  (Enter to send)",
                                                 show_label=False, scale=8, lines=1, max_lines=8,
                                                 autofocus=True, elem_id="ls-message")  # fmt: skip
                            send = gr.Button("Send", variant="primary", scale=1, min_width=80, elem_id="ls-send")
                            stop = gr.Button("Stop", variant="stop", scale=1, min_width=80, elem_id="ls-stop")
                        with gr.Row():
                            regenerate = gr.Button("↻ Regenerate", size="sm", elem_id="ls-regenerate")
                            clear = gr.Button("Clear chat", size="sm", elem_id="ls-clear")
                    with gr.Column(scale=1, min_width=300):
                        stats = gr.HTML(stats_html(None), elem_id="ls-stats-box")
                        with gr.Accordion("Sampling & speculation", open=True):
                            mode = gr.Dropdown(list(MODES), value=defaults.mode, label="mode", elem_id="ls-mode",
                                               info="rejection = exact default; invariant = same seed → same text with any draft")  # fmt: skip
                            temperature = gr.Slider(0, 2, value=defaults.temperature, step=0.05, label="temperature",
                                                    elem_id="ls-temperature")
                            draft_tokens = gr.Slider(0, 16, value=defaults.draft_tokens, step=1, label="draft tokens K",
                                                     info="with adaptive K: the most drafted per step")  # fmt: skip
                            adaptive = gr.Checkbox(defaults.adaptive, label="adaptive K",
                                                   info="choose K each step from measured acceptance and costs")  # fmt: skip
                            with gr.Row():
                                top_k = gr.Number(defaults.top_k, label="top-k", precision=0, minimum=0)
                                top_p = gr.Number(defaults.top_p, label="top-p", minimum=0, maximum=1, step=0.05)
                                min_p = gr.Number(defaults.min_p, label="min-p", minimum=0, maximum=1, step=0.01)
                            with gr.Row():
                                seed = gr.Number(defaults.seed, label="seed (-1 = fresh)", precision=0)
                                max_tokens = gr.Number(defaults.max_tokens, label="max tokens", precision=0, minimum=1,
                                                       elem_id="ls-max-tokens")
                            system = gr.Textbox(defaults.system_prompt, label="system prompt", lines=2,
                                                placeholder="empty = the template's default")  # fmt: skip
                        with gr.Accordion("Model pair", open=False):
                            target = gr.Dropdown(targets, value=config.model.target, label="target (.gguf)",
                                                 allow_custom_value=True)  # fmt: skip
                            draft = gr.Dropdown(drafts, value=config.model.draft, label="draft (.gguf, ngram, none)",
                                                allow_custom_value=True)  # fmt: skip
                            load = gr.Button("Load pair", elem_id="ls-load-pair")
            with gr.Tab("Debugging", id="debug", elem_id="ls-tab-debug"):
                summary = gr.HTML(dv.summary_html(None), elem_id="ls-summary")
                with gr.Row():
                    save = gr.Button("Save trace (.jsonl)", size="sm", elem_id="ls-save-trace")
                    upload = gr.UploadButton("Load trace (.jsonl)", size="sm", file_types=[".jsonl", ".json", ".txt"],
                                             type="filepath", elem_id="ls-load-trace")  # fmt: skip
                    replay = gr.Button("Replay without draft", size="sm", elem_id="ls-replay")
                saved_file = gr.File(label="saved trace — attach it to a bug report; `Load trace` reads it back",
                                     interactive=False, visible=False, elem_id="ls-saved-file")  # fmt: skip
                debug_notice = gr.HTML("", elem_id="ls-debug-notice")
                replay_box = gr.HTML(dv.replay_html(None), elem_id="ls-replay-box")
                with gr.Row():
                    plot_pos = gr.Plot(dv.acceptance_by_position_plot(None), show_label=False)
                    plot_run = gr.Plot(dv.running_acceptance_plot(None), show_label=False)
                    plot_time = gr.Plot(dv.timeline_plot(None), show_label=False)
                with gr.Row(equal_height=False):
                    with gr.Column(scale=3):
                        table = gr.Dataframe(headers=dv.STEP_COLUMNS, value=[], label="verified positions, step by step",
                                             interactive=False, wrap=True, max_height=420, elem_id="ls-steps")  # fmt: skip
                    with gr.Column(scale=2):
                        token_pick = gr.Dropdown([], label="token", elem_id="ls-token-dropdown", type="value")
                        top = gr.HTML(dv.top_table_html(None, None), elem_id="ls-top")
        token_click = gr.Textbox(visible="hidden", elem_id="ls-token-pick")

        settings_inputs = [mode, temperature, top_k, top_p, min_p, draft_tokens, seed, max_tokens, system, adaptive]

        def respond(msg, st, md, t, tk, tp, mp, k, sd, mx, sysp, ad, request: gr.Request):
            yield from app.respond(msg, st, Settings(md, t, tk, tp, mp, k, sd, mx, sysp, ad), _key(request))

        def refresh(st):
            summary_html, rows, f1, f2, f3, choices, selected, top_html = app.debug_outputs(st)
            return summary_html, rows, f1, f2, f3, gr.update(choices=choices, value=selected), top_html

        debug_targets = [summary, table, plot_pos, plot_run, plot_time, token_pick, top]

        respond_outputs = [chat, stats, notice, state, message]
        def queue_message(msg, st, request: gr.Request):
            return app.queue_message(msg, st, _key(request))

        def pop_for_regenerate(st, request: gr.Request):
            return app.pop_for_regenerate(st, _key(request))

        for trigger in (message.submit, send.click):
            (
                trigger(queue_message, [message, state], [message, chat, pending], queue=False, show_progress="hidden")
                .then(respond, [pending, state, *settings_inputs], respond_outputs, concurrency_limit=1,
                      concurrency_id="engine", show_progress="hidden", api_name=False)  # fmt: skip
                .then(refresh, [state], debug_targets, show_progress="hidden", api_name=False)
            )
        def stop_reply(request: gr.Request) -> None:
            app.stop(_key(request))

        stop.click(stop_reply, None, None, queue=False, api_name=False)
        regenerate.click(pop_for_regenerate, [state], [pending, state, chat], queue=False, api_name=False).then(
            respond, [pending, state, *settings_inputs], respond_outputs, concurrency_limit=1,
            concurrency_id="engine", show_progress="hidden", api_name=False,
        ).then(refresh, [state], debug_targets, show_progress="hidden", api_name=False)  # fmt: skip
        clear.click(app.clear, None, [state, chat, stats, notice], queue=False, api_name=False).then(
            refresh, [state], debug_targets, api_name=False
        )
        load.click(app.load_pair, [target, draft], [notice, badge], concurrency_limit=1, concurrency_id="engine",
                   api_name=False)  # fmt: skip

        token_pick.input(app.select_token, [state, token_pick], [state, top], api_name=False)
        token_click.change(app.pick_from_chat, [token_click, state], [state], api_name=False).then(
            refresh, [state], debug_targets, api_name=False
        ).then(lambda: gr.Tabs(selected="debug"), None, [tabs], api_name=False)
        def save_trace(st):
            path, notice_box = app.save_trace(st)
            return gr.update(value=path, visible=path is not None), notice_box

        save.click(save_trace, [state], [saved_file, debug_notice], api_name=False)
        upload.upload(app.load_trace, [upload, state], [state, debug_notice], api_name=False).then(
            refresh, [state], debug_targets, api_name=False
        )
        replay.click(lambda st: app.replay(st)[0], [state], [replay_box], concurrency_limit=1,
                     concurrency_id="engine", api_name=False)  # fmt: skip

        # One programmatic endpoint for scripts and the end-to-end test: message + settings in,
        # streamed (chat html, stats html, notice html) out. State stays in the caller's session.
        api_box = gr.Textbox(visible="hidden")

        def api_chat(msg, md, t, tk, tp, mp, k, sd, mx, sysp, ad, request: gr.Request):
            settings = Settings(md, t, tk, tp, mp, k, sd, mx, sysp, ad)
            app.new_request(_key(request))
            for chat_html, stats_box, notice_box, _st, _msg in app.respond(msg, ChatState(), settings, _key(request)):
                yield chat_html, stats_box, notice_box

        api_box.submit(api_chat, [api_box, *settings_inputs], [chat, stats, notice], concurrency_limit=1,
                       concurrency_id="engine", api_name="chat")  # fmt: skip
    return demo


def _key(request: Any) -> str:
    return getattr(request, "session_hash", None) or "default"


def launch(config: Config) -> None:
    """Start the UI on ``config.ui.host:config.ui.port`` and block until interrupted."""
    from .theme import CSS, HEAD

    session = Session(config)
    startup_notice = ""
    try:
        warning = session.engine.pair_warning()  # load now: the first message is fast, a bad pair is reported
        startup_notice = notice_html(warning) if warning else ""
    except LocalspecError as error:
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
        # printed once the server answers: scripts (and the tests) wait for this line, not for a clock
        print(f"localspec UI: http://{host}:{port}  (pair: {session.pair_name}; Ctrl-C to stop)", flush=True)
        demo.block_thread()
    finally:
        session.close()
