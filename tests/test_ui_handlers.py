"""The UI's handlers against the real engine on the demo pair — no browser.

The handlers are plain methods of :class:`ui.handlers.ChatApp`; these tests call
them exactly as Gradio would and check what the user would see (HTML spans
with statuses and tooltips, notices, stats) and what the app keeps (plain-text
history, traces that round-trip, replay verdicts).
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from pathlib import Path

import pytest

from localspec.app.config import Config, load_config
from localspec.app.conversation import Conversation
from localspec.app.invariance import InvarianceReport
from localspec.app.trace import Trace
from localspec.ui.debug_view import STEP_COLUMNS
from localspec.ui.handlers import ChatApp, ChatState
from localspec.ui.render import rows_by_position
from localspec.ui.session import Session, Settings
from tests.conftest import GEMMA, TEST_THREADS, require, run_cli

pytestmark = pytest.mark.models

SPAN = re.compile(r'<span class="ls-tok ls-(\w+)[^"]*" data-status="(\w+)" data-i="(\d+)">')


@pytest.fixture(scope="module")
def app(demo_paths) -> ChatApp:
    target, draft, _ = demo_paths
    config = load_config().with_overrides({
        "model.target": str(target), "model.draft": str(draft), "model.n_ctx": 1024, "sampling.max_tokens": 24,
        "model.threads": TEST_THREADS,
    })  # fmt: skip
    session = Session(config)
    _ = session.engine  # load once for the module
    yield ChatApp(session)
    session.close()


@pytest.fixture(scope="module")
def conversation(app):
    """One two-turn chat shared by the tests that only read it: (outputs of turn 1, final state)."""
    state = ChatState()
    outputs = list(app.respond("Name three <b>colours</b>.", state, settings(max_tokens=16), key="conv"))
    list(app.respond("Now say goodbye.", state, settings(max_tokens=6), key="conv"))
    return outputs, state


def settings(**overrides) -> Settings:
    # fixed K: with adaptive K the draft length, and so the sample, follows measured timings
    values = dict(mode="rejection", temperature=0.7, seed=11, max_tokens=16, draft_tokens=4, adaptive=False)
    values.update(overrides)
    return Settings.from_config(Config()).replace(**values)


def spans(chat_html: str) -> list[tuple[str, str, int]]:
    return [(cls, status, int(i)) for cls, status, i in SPAN.findall(chat_html)]


def test_streaming_reply_colours_every_token_with_its_fate(app, conversation):
    outputs, state = conversation
    final = outputs[-1]
    assert final.notice == "" and final.textbox == ""
    run = state.turns[0].trace
    assert run.result is not None and run.result["stop_reason"] in ("max_tokens", "eos")
    found = spans(final.chat)
    # the conversation goes to the page when the reply starts (naming it, so the page asks for its tokens)
    # and when it ends; in between, only the stats
    assert json.loads(outputs[0].stream) == {"reply": run.id}
    assert all(o.chat is None and o.stream is None for o in outputs[1:-1])
    statuses = {status for _, status, _ in found}
    assert statuses <= {"accepted", "corrected", "bonus", "target"}
    assert "accepted" in statuses  # the Q4_1 draft agrees with its F32 target ~98% of the time
    assert all(cls == status for cls, status, _ in found)
    # every emitted token is on screen with the status the engine gave it
    by_index = {i: status for _, status, i in found}
    assert by_index == {i: t["status"] for i, t in enumerate(run.tokens) if t["text"]}
    # a token's evidence is read when it is hovered (the page asks by reply id and token index)
    assert f'data-reply="{run.id}"' in final.chat and "title=" not in final.chat
    for _, status, i in found:
        evidence = app.evidence(f"{run.id}:{i}")
        token = run.tokens[i]
        if status == "accepted":  # the rule's p, or where bounds of the row's total decided, the row's record's
            shown = token["p"] if token["p"] is not None else rows_by_position(run.steps)[token["position"]]["p"]
            assert f"p(token) = {shown:.3f}" in evidence and "uniform u = " in evidence
        elif status == "corrected":
            assert "residual" in evidence and "rejecting" in evidence
        elif status == "bonus":
            assert "free target token" in evidence
    assert app.evidence(f"{run.id}:{len(run.tokens)}") == app.evidence("no-such-reply:0") == app.evidence("x") == ""
    final_html, stats_html = final.chat, final.stats
    # the user's text is escaped, never interpreted
    assert "Name three &lt;b&gt;colours&lt;/b&gt;." in final_html and "<b>colours</b>" not in final_html
    # the next prompt is built from plain text only
    assert state.conversation.history()[0] == ("Name three <b>colours</b>.", run.text)
    assert "<span" not in state.conversation.history()[0][1]
    # the stats panel reports the reply
    assert 'data-stat="tps"' in stats_html and "acceptance" in stats_html
    assert re.search(r'data-stat="acc"><div class="ls-card-v">\d+%', stats_html)
    assert re.search(r'data-stat="speedup"><div class="ls-card-v">\d+\.\d\d×', stats_html)
    assert "ls-verdict" in stats_html


def read_updates(app: ChatApp, reply: str, lines: int | None = None) -> list[dict]:
    """The page's reading of a reply's updates (ChatApp.updates): every line, or the first ``lines`` and then
    leaving, as a page that went away."""

    async def read() -> list[dict]:
        found, updates = [], app.updates(reply)
        async for line in updates:
            found.append(json.loads(line))
            if len(found) == lines:
                await updates.aclose()
                break
        return found

    return asyncio.run(read())


def test_the_page_reads_a_streaming_replys_tokens_and_stats_and_gets_them_all(app):
    """While a reply streams, the page reads one response: lines with the operations since the last and,
    now and then, the stats panel; applied in order they leave the bubble as the finished reply's full
    render. The last line says it is over and carries the final stats."""
    from .test_ui_stream import Bubble

    state = ChatState()
    stream = app.respond("Tell me a long story about a dragon.", state, settings(max_tokens=120), key="t-poll",
                         every=None)  # fmt: skip
    reply = json.loads(next(stream).stream)["reply"]
    updates = read_updates(app, reply)
    bubble = Bubble()
    bubble.apply([op for update in updates for op in update["ops"]])
    assert not bubble.stale
    final = list(stream)
    assert len(final) == 1, "no update of the page's between the first and the last: the page reads them"
    run = state.turns[-1].trace
    assert len(run.tokens) == 120 and not updates[0]["done"] and updates[-1]["done"]
    assert [u["done"] for u in updates].count(True) == 1
    assert 'data-stat="tps"' in updates[-1]["stats"] and updates[-1]["stats"] == final[-1].stats
    body = re.search(
        f'data-reply="{reply}"><div class="ls-bubble">(.*?)</div><div class="ls-footer">', final[-1].chat, re.DOTALL
    ).group(1)
    assert bubble.html() == re.sub(r' data-b="\d+"', "", body) != ""
    assert read_updates(app, reply) == [{"ops": [], "done": True}]  # over: the final render shows it
    assert read_updates(app, "no-such-reply") == [{"ops": [], "done": True}]


def test_a_page_that_leaves_mid_reply_ends_the_reply_within_a_step(app):
    """The page reads a reply's updates to its end; a response left before (the tab closed or reloaded) tells
    the server the page went away, and the reply ends as Stop ends it, instead of running to its length."""
    state = ChatState()
    app.queue_message("Tell me a long story about a dragon.", state, key="t-leave")
    stream = app.respond("Tell me a long story about a dragon.", state, settings(max_tokens=400), key="t-leave",
                         every=None)  # fmt: skip
    reply = json.loads(next(stream).stream)["reply"]
    assert not read_updates(app, reply, lines=1)[0]["done"]
    final = list(stream)[-1]
    assert state.turns[-1].trace.result["stop_reason"] == "cancelled" and "stopped" in final.chat


def test_second_turn_reuses_plain_history(conversation):
    _outputs, state = conversation
    assert len(state.turns) == 2
    prompt = state.turns[1].trace.header["prompt_text"]
    assert "Name three <b>colours</b>." in prompt and state.turns[0].trace.text in prompt
    assert "ls-tok" not in prompt and "<span" not in prompt


def test_stop_from_another_thread_ends_the_reply_within_one_step(app):
    """Stop pressed (on another thread, as Gradio runs it) once the reply streams.

    The loop looks at Stop between steps, so after it is set at most the step
    in progress finishes. The reply runs on a thread of its own, so the test
    counts the steps and tokens from inside the Stop event, right after it is
    set: nothing can start after that, only the step in progress end.
    """
    k = 4
    state = ChatState()
    seen: dict[str, int] = {}

    class CountedStop(threading.Event):
        def set(self) -> None:
            super().set()
            run = state.turns[-1].trace
            seen.setdefault("steps", len(run.steps))
            seen.setdefault("tokens", len(run.tokens))

    app.queue_message("Tell me a long story about a dragon.", state, key="t3")
    app._cancels["t3"] = CountedStop()  # the tab's Stop, counting (queue_message cleared the old one)
    stream = app.respond(
        "Tell me a long story about a dragon.", state, settings(max_tokens=400, draft_tokens=k), key="t3"
    )
    for _update in stream:
        if state.turns and state.turns[-1].trace.tokens:
            presser = threading.Thread(target=app.stop, args=("t3",))
            presser.start()
            presser.join()
            break
    rest = list(stream)
    run = state.turns[-1].trace
    assert run.result["stop_reason"] == "cancelled"
    assert len(run.steps) <= seen["steps"] + 1, "only the step in progress may finish after Stop"
    assert len(run.tokens) <= seen["tokens"] + k + 1
    assert "stopped" in rest[-1].chat
    # the next message is a new request: the old Stop does not cancel it
    app.queue_message("Hi", state, key="t3")
    list(app.respond("Hi", state, settings(max_tokens=6), key="t3"))
    assert state.turns[-1].trace.result["stop_reason"] != "cancelled"


def test_stop_pressed_while_the_request_is_queued(app):
    """The request never starts; the conversation is unchanged and the message is back in the box."""
    state = ChatState()
    app.queue_message("Tell me about tea.", state, key="t12")  # sent: the request waits in the queue
    app.stop("t12")  # Stop while it waits
    chat_html, _stats, notice, state, textbox, _stream = list(
        app.respond("Tell me about tea.", state, settings(), key="t12")
    )[-1]
    assert state.turns == [] and textbox == "Tell me about tea."
    assert "stopped before the reply began" in notice and "Tell me about tea" not in chat_html
    # sending it again works
    app.queue_message("Tell me about tea.", state, key="t12")
    list(app.respond("Tell me about tea.", state, settings(max_tokens=6), key="t12"))
    assert len(state.turns) == 1 and state.turns[0].trace.tokens


def test_a_second_tabs_stop_cancels_only_its_own_queued_request(app):
    """The two-tab browser test without a browser, in its order of events: tab A streams; tab B
    sends (its request waits) and presses Stop. A's reply goes on to its own end; B's request,
    when its turn comes, does not start. Stops are per tab (Gradio's session hash), so neither B's
    Stop nor B's send (which forgets B's older Stop) touches A's."""
    a, b = ChatState(), ChatState()
    app.queue_message("Tell me about rivers.", a, key="tab-a")
    stream = app.respond("Tell me about rivers.", a, settings(mode="greedy", max_tokens=40), key="tab-a")
    for _update in stream:  # paused mid-reply, engine lock held: as when B's clicks arrive
        if a.turns and a.turns[-1].trace.tokens:
            break
    _, waiting, _ = app.queue_message("Tell me about mountains.", b, key="tab-b")
    assert 'id="ls-waiting"' in waiting, "B is told it waits for the other conversation"
    app.stop("tab-b")
    final_a = list(stream)[-1][0]
    assert a.turns[-1].trace.result["stop_reason"] == "max_tokens" and "ls-chip-stop" not in final_a
    _chat, _stats, notice, b, textbox, _stream = list(
        app.respond("Tell me about mountains.", b, settings(), key="tab-b")
    )[-1]
    assert "stopped before the reply began" in notice and b.turns == [] and textbox == "Tell me about mountains."


def test_bad_settings_show_a_one_line_error_and_keep_the_message(app):
    state = ChatState()
    chat_html, _stats, notice, state, textbox, _stream = list(
        app.respond("Hi", state, settings(temperature=-1), key="t4")
    )[-1]
    assert "temperature" in notice and "ls-notice-error" in notice
    assert textbox == "Hi" and state.turns == []


def test_adaptive_checkbox_and_k_reach_the_generation_options(app):
    """The settings panel, not the loaded config, decides adaptive K and K (K = 0 must not collide
    with the configured adaptive minimum of 1)."""
    for adaptive, k in ((False, 3), (True, 5), (True, 0)):
        state = ChatState()
        *_, (chat_html, _s, notice, state, _t, _stream) = app.respond(
            "Hi", state, settings(max_tokens=6, adaptive=adaptive, draft_tokens=k), key="t-adaptive"
        )
        options = state.view.header["options"]
        assert notice == "" and spans(chat_html), notice
        assert (options["adaptive"], options["draft_tokens"]) == (adaptive, k)
        assert options["min_draft_tokens"] <= k


def test_incompatible_pair_shows_error_and_the_app_stays_usable(app, demo_paths):
    require(GEMMA)  # a missing file would also be refused: the test must see the tokenizer check itself
    target, draft, _ = demo_paths
    before = app.session.engine
    notice, badge = app.load_pair(str(target), str(GEMMA))
    assert "ls-notice-error" in notice and "cannot draft for target" in notice
    assert "still using" in notice and "Q4_1" in badge and "both models on the CPU (" in badge
    assert app.session.engine is before
    notice, _ = app.load_pair(str(target), "models/does-not-exist.gguf")
    assert "does-not-exist.gguf" in notice and app.session.engine is before
    state = ChatState()
    *_, (chat_html, _s, notice, state, _t, _stream) = app.respond("Hi", state, settings(max_tokens=6), key="t5")
    assert notice == "" and spans(chat_html)


SWAP_UNDER_A_MEMORY_LIMIT = """
import re, resource, sys
from dataclasses import replace
from localspec.app.config import Config, load_config
from localspec.app.invariance import InvarianceReport
from localspec.app.engine import Engine
from localspec.core.errors import OutOfMemoryError
from localspec.ui.handlers import ChatApp, ChatState
from localspec.ui.session import Session, Settings

target, draft, big_target, big_draft, threads = sys.argv[1:]
config = load_config().with_overrides({"model.target": target, "model.draft": draft, "model.use_mmap": False,
                                       "model.n_ctx": 512, "model.threads": int(threads)})


def address_space() -> int:
    return int(re.search(r"VmSize:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) * 1024


def replies(app) -> bool:
    settings = Settings.from_config(Config()).replace(max_tokens=4, adaptive=False)
    *_, last = app.respond("Hi", ChatState(), settings, key="swap")
    return last[2] == "" and "data-status" in last[0]


Engine(config).close()  # the process's one-time costs (threads, arenas) first
before = address_space()
session = Session(config)
app = ChatApp(session)
_ = session.engine
pair = address_space() - before
resource.setrlimit(resource.RLIMIT_AS, (address_space() + pair // 2, resource.RLIM_INFINITY))
try:
    Engine(config).close()
    print("control: a second pair loaded")
except OutOfMemoryError:
    print("control: no room for a second pair")
print("swap:", app.load_pair(target, draft)[0])
print("replies:", replies(app))
session.engine._reload_target({"n_batch": 256})
print("reloaded target:", session.engine.settings.n_batch, replies(app))
engine = session.engine
engine._invariance = InvarianceReport("stood in", identical=False, max_abs_diff=0.1, rows_compared=8)
engine.settings = replace(engine.settings, flash_attention=True)  # a suspect whose trial loads a second copy
print("diagnosed:", engine.diagnosis(refresh=True) is not None, replies(app))
print("too large:", app.load_pair(big_target, big_draft)[0])
print("loaded:", session.loaded)
print("replies again:", replies(app), session.engine.pair_name)
"""


def test_a_pair_swap_where_memory_holds_only_one_pair_releases_the_old_pair_first(demo_paths, tmp_path):
    """Memory that holds one pair but not two (a GPU's, typically): loading the next pair, the target again
    with other settings, or the doctor's trial copy of the target, releases the old one first instead of
    failing (the trial's target is loaded again after it); a pair that does not fit even alone
    says so, and the next message loads the old pair again. Real loads of the demo pair read into memory
    (use_mmap false) in a process whose address space allows half a pair more than one; control: a second
    pair beside the first fails there."""
    import subprocess
    import sys

    from tests.conftest import QWEN_DRAFT, QWEN_TARGET

    require(QWEN_TARGET, QWEN_DRAFT)
    target, draft, _ = demo_paths
    args = [str(target), str(draft), str(QWEN_TARGET), str(QWEN_DRAFT), str(TEST_THREADS)]
    done = subprocess.run([sys.executable, "-c", SWAP_UNDER_A_MEMORY_LIMIT, *args], capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    said = dict(line.split(": ", 1) for line in done.stdout.splitlines() if ": " in line)
    assert done.returncode == 0 and said.get("control") == "no room for a second pair", done.stdout + done.stderr
    assert "ls-notice-ok" in said["swap"] and said["replies"] == "True", said
    assert said["reloaded target"] == "256 True", said
    assert said["diagnosed"] == "True True", said  # the doctor's trial took the target's place, then gave it back
    assert "ls-notice-error" in said["too large"] and "qwen2.5-coder-1.5b" in said["too large"], said
    assert f"even with {target.name} + {draft.name} released" in said["too large"], said
    assert said["loaded"] == "False" and said["replies again"] == f"True {target.name} + {draft.name}", said


def test_trace_save_and_load_round_trip(app, conversation, tmp_path):
    state = ChatState(Conversation(turns=list(conversation[1].turns[:1])), view=conversation[1].turns[0].trace)
    live = state.view
    path = live.save(tmp_path / "ui.jsonl")
    trace = Trace.load(path)  # the CLI's reader accepts it
    assert trace.header["prompt_tokens"] == live.header["prompt_tokens"]
    assert trace.result["text"] == live.text and len(trace.tokens) == len(live.tokens)
    assert set(json.loads(path.read_text().splitlines()[0])) >= {"kind", "version", "target", "draft", "config",
                                                                "options", "prompt_text", "prompt_tokens"}  # fmt: skip
    loaded_state, notice = app.load_trace(str(path), ChatState())
    assert "ls-notice-ok" in notice
    loaded = loaded_state.view
    assert loaded.events == live.events
    summary, rows, *_plots, choices, selected, top = app.debug_outputs(loaded_state)
    assert rows == app.debug_outputs(state)[1] and len(rows[0]) == len(STEP_COLUMNS)
    assert "loaded trace" in summary and len(choices) == len(live.tokens)
    assert "target p (top-10)" in top and top.count("<tr") >= 10


def test_trace_written_by_the_cli_loads_in_the_ui(app, demo_paths, tmp_path):
    target, draft, _ = demo_paths
    path = tmp_path / "cli.jsonl"
    done = run_cli("generate", "What is 2+2?", "--max-tokens", "12", "--ctx", "1024", "--seed", "3",
                   "--target", str(target), "--draft", str(draft), "--trace", str(path), "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    state, notice = app.load_trace(str(path), ChatState())
    assert "ls-notice-ok" in notice
    assert state.view.text == result["text"]
    assert [t["status"] for t in state.view.tokens] == result["statuses"]
    summary, rows, fig_pos, _fig_run, fig_time, choices, _sel, _top = app.debug_outputs(state)
    assert len(rows) >= result["stats"]["steps"]
    parts = fig_time.axes[0].patches  # draft, verify and other stacked, a value per step each
    assert [len(part.get_data().values) for part in parts] == [result["stats"]["steps"]] * 3
    assert len(fig_pos.axes[0].patches) == len(result["stats"]["drafted_by_position"])


def test_loading_a_file_that_is_not_a_trace_says_so(app, tmp_path):
    bad = tmp_path / "notes.jsonl"
    bad.write_text("hello\n")
    state, notice = app.load_trace(str(bad), ChatState())
    assert "ls-notice-error" in notice and "not JSON" in notice and state.view is None


def test_replay_without_draft_is_byte_identical_in_invariant_mode(app):
    state = ChatState()
    list(app.respond("Write one sentence about the sea.", state, settings(mode="invariant", seed=5, max_tokens=16),
                     key="t7"))  # fmt: skip
    assert state.view.header["options"]["mode"] == "invariant"
    verdict, report = app.replay(state)
    assert report is not None and report.replay.header["options"]["draft_tokens"] == 0
    assert report.replay.stats().drafted == 0
    assert report.identical, report.explanation
    assert report.replay.text.encode() == state.view.text.encode()
    assert "byte-identical" in verdict and "ls-notice-ok" in verdict


def test_replay_refuses_a_non_invariant_reply(app):
    state = ChatState()
    list(app.respond("Hi", state, settings(max_tokens=4), key="t8"))
    verdict, report = app.replay(state)
    assert report is None and "invariant" in verdict and "ls-notice-error" in verdict


def test_replay_marks_the_first_difference(app, monkeypatch):
    """A run whose recorded tokens were tampered with must be reported as different, at that token."""
    # the batch-invariance measurement itself is the doctor's (and is slow); here only its report is shown
    report = InvarianceReport("demo-target", identical=False, max_abs_diff=0.02, rows_compared=8, details=["probe"])
    monkeypatch.setattr(app.session.engine, "invariance", lambda measure=True: report)
    state = ChatState()
    list(app.respond("Name a fruit.", state, settings(mode="invariant", seed=9, max_tokens=12), key="t9"))
    run = state.view
    tampered = Trace(header=run.header, events=[dict(e) for e in run.events])
    tokens = tampered.tokens
    tokens[3]["token_id"] = tokens[3]["token_id"] + 1
    tokens[3]["text"] = "XYZ"
    tampered.events = [e for e in tampered.events if e.get("kind") != "result"]
    state.view = tampered
    verdict, report = app.replay(state)
    assert report is not None and not report.identical and report.first_difference == 3
    assert "token #4" in verdict and "batch invariance" in verdict and "ls-hl" in verdict
    assert "DIFFER" in verdict  # the measured report is shown to the user


def test_clicking_a_token_selects_it_for_the_debugging_view(app, conversation):
    state = ChatState(Conversation(turns=list(conversation[1].turns)), view=conversation[1].turns[1].trace)
    state = app.pick_from_chat("0:2:123", state)
    assert state.view is state.turns[0].trace and state.selected == 2
    *_, selected, top = app.debug_outputs(state)
    assert selected == 2 and "token #3" in top


def test_regenerate_resends_the_last_message_and_clear_empties(app, conversation):
    state = ChatState(Conversation(turns=list(conversation[1].turns)))
    message, state, chat_html = app.pop_for_regenerate(state)
    assert message == "Now say goodbye." and len(state.turns) == 1
    assert "Now say goodbye." in chat_html and len(spans(chat_html)) == len(
        [t for t in state.turns[0].trace.tokens if t["text"]]
    )
    new_state, chat_html, stats_html, notice = app.clear()
    assert new_state.turns == [] and "Ask anything" in chat_html and notice == ""


# --- found by a reliability probe of the front ends ---------------------------
def test_a_long_conversation_leaves_old_turns_out_instead_of_failing(demo_paths):
    """`localspec ui --ctx 512`: long messages, one after another, keep getting answers (as in the terminal)."""
    target, draft, _ = demo_paths
    config = load_config().with_overrides({"model.target": str(target), "model.draft": str(draft),
                                           "model.n_ctx": 512, "model.threads": TEST_THREADS})  # fmt: skip
    session = Session(config)
    try:
        chat_app, state = ChatApp(session), ChatState()
        notices = []
        for tag in "abcd":
            message = f"Note {tag}: " + " ".join(f"{tag}{i}" for i in range(60))
            *_, (_html, _stats, notice, state, textbox, _stream) = chat_app.respond(
                message, state, settings(max_tokens=16), key="long"
            )
            assert "ls-notice-error" not in notice and textbox == "", notice
            assert state.turns[-1].trace.result is not None
            notices.append(notice)
        assert any("left out of the prompt" in n for n in notices), notices
        assert len(state.turns) == 4 and state.conversation.dropped > 0
    finally:
        session.close()


def test_started_from_another_folder_paths_resolve_the_same(app, conversation, tmp_path, monkeypatch):
    """`cd $HOME && localspec ui`: the pair pickers offer paths that load, and saved traces are servable."""
    from localspec.ui.handlers import allowed_paths, model_choices

    monkeypatch.chdir(tmp_path)
    config = app.session.config
    targets, drafts = model_choices(config)
    assert all(Path(p).is_absolute() for p in targets + drafts if p not in ("ngram", "none"))
    notice, _badge = app.load_pair(targets[0], drafts[0])
    assert "ls-notice-ok" in notice, notice
    state = ChatState(Conversation(turns=list(conversation[1].turns[:1])), view=conversation[1].turns[0].trace)
    path, notice = app.save_trace(state)
    assert "ls-notice-ok" in notice
    assert any(Path(path).resolve().is_relative_to(Path(folder).resolve()) for folder in allowed_paths(config))


def test_the_verdict_quotes_the_panels_acceptance():
    """One number, one definition: the panel's acceptance (accepted / drafted) is the one the verdict quotes."""
    from localspec.core.events import GenerationStats
    from localspec.ui.render import stats_html
    from localspec.ui.session import speed_of

    # 97 of 100 drafts accepted, but the rule examined 110 (the rejected ones): alpha would say 88%
    stats = GenerationStats(n_tokens=300, steps=100, drafted=100, accepted=97, examined=110, draft_s=4.0, verify_s=6.0)
    speed = speed_of(type("Reply", (), {"stats": lambda self: stats})(), 0.01)
    assert "97% of its tokens are accepted" in speed.verdict
    assert 'data-stat="acc"><div class="ls-card-v">97%' in stats_html(speed)


def test_the_top_table_says_when_q_is_the_drafts_head() -> None:
    """A model draft draws from its head (sampling.draft_weights), often fewer tokens than the top-10 of p:
    the q column says so rather than looking cut short; a full q list keeps the plain title."""
    from localspec.ui.debug_view import top_table_html

    def run(n_q: int) -> Trace:
        entry = lambda t: {"token": t, "text": f"t{t}", "prob": 0.1}  # noqa: E731
        row = {"position": 5, "draft_token": 1, "draft_text": "t1", "q": 0.6, "p": 0.4, "accept_prob": 0.66,
               "uniform": 0.2, "outcome": "accepted", "top_p": [entry(t) for t in range(10)],
               "top_q": [entry(t) for t in range(n_q)]}  # fmt: skip
        return Trace({}, [{"kind": "token", "position": 5, "token_id": 1, "text": "t1", "status": "accepted"},
                          {"kind": "step", "rows": [row]}])  # fmt: skip

    assert "draft q (its head: the 3 it drew from)" in top_table_html(run(3), 0)
    assert "draft q (top-10)" in top_table_html(run(10), 0) and "its head" not in top_table_html(run(10), 0)


def test_text_that_is_not_valid_unicode_gets_a_reply(app) -> None:
    """A lone surrogate (a browser can send one) is shown and kept as U+FFFD; the reply goes ahead."""
    state = ChatState()
    _box, pending_html, pending = app.queue_message("\ud800 hi", state, key="t-unicode")
    assert pending == "\ufffd hi" and "\ud800" not in pending_html
    raw = "\ud800 hi"  # as the UI's API endpoint passes it on, before any queue_message
    chat_html, _stats, notice, state, textbox, _stream = list(
        app.respond(raw, state, settings(max_tokens=6), key="t-unicode")
    )[-1]
    assert notice == "" and textbox == "" and state.turns[-1].user == "\ufffd hi"
    assert state.turns[-1].trace.tokens and chat_html.encode("utf-8")
    assert state.conversation.turns[-1].trace.header["prompt_text"].encode("utf-8")


def test_a_request_that_waited_while_its_pair_was_closed_ends_with_an_error_not_a_crash(demo_paths) -> None:
    """The UI swaps pairs once the reply in flight ends; a reply queued on the old pair (another tab's) may get
    the lock after the old pair was freed. It ends with a one-line error instead of computing on freed memory.
    In a subprocess, since the failure this guards against kills the process; control: the same request on an
    open pair streams."""
    import subprocess
    import sys

    target, draft, _ = demo_paths
    script = """
import sys
from localspec.app.config import load_config
from localspec.app.engine import Engine
from localspec.core.errors import LocalspecError

config = load_config().with_overrides({"model.target": sys.argv[1], "model.draft": sys.argv[2], "model.n_ctx": 512})
engine = Engine(config)
prompt = engine.encode_raw("Once upon a time").tokens
print("open:", sum(1 for _ in engine.stream(prompt, engine.options(max_tokens=4))) > 0)
waiting = engine.stream(prompt, engine.options(max_tokens=4))  # queued: it takes the lock on its first step
engine.close()
try:
    next(waiting)
    print("closed: streamed")
except LocalspecError as error:
    print("closed:", error)
"""
    done = subprocess.run([sys.executable, "-c", script, str(target), str(draft)], capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    said = dict(line.split(": ", 1) for line in done.stdout.splitlines() if ": " in line)
    assert done.returncode == 0 and said.get("open") == "True", (done.returncode, done.stdout, done.stderr[-2000:])
    assert said["closed"].endswith("was closed while this request waited; send it again"), said
