"""The Conversation service every front end uses, on the demo pair with a small context (512 tokens)."""

from __future__ import annotations

import pytest

from localspec.app.conversation import Conversation
from localspec.core.errors import PromptTooLongError

from .conftest import make_engine

pytestmark = pytest.mark.models

N_CTX = 512


@pytest.fixture(scope="module")
def engine(demo_paths):
    target, draft, _ = demo_paths
    built = make_engine(target, draft, **{"model.n_ctx": N_CTX})
    yield built
    built.close()


@pytest.fixture(scope="module")
def config(engine):
    return engine.config.with_overrides({"sampling.max_tokens": 16, "sampling.seed": 3, "speculative.adaptive": False})


def long_message(n_items: int, tag: str) -> str:
    return f"Note {tag}: " + " ".join(f"{tag}{i}" for i in range(n_items))


def reply(conversation: Conversation, engine, config, text: str):
    events = list(conversation.reply(engine, config, text))
    trace = conversation.turns[-1].trace
    assert events and trace.result is not None and not trace.error
    return trace


def test_old_turns_are_left_out_with_a_note_when_the_context_fills(engine, config) -> None:
    conversation = Conversation()
    traces = [reply(conversation, engine, config, long_message(60, tag)) for tag in "abcd"]
    assert conversation.dropped > 0
    noted = [t for t in traces if "left out of the prompt" in t.notice]
    assert noted, [t.notice for t in traces]
    last = traces[-1].header
    assert len(last["prompt_tokens"]) + 16 <= N_CTX  # room kept for the reply
    assert (
        "Note a:" not in last["prompt_text"] and "Note c:" in last["prompt_text"] and "Note d:" in last["prompt_text"]
    )
    assert traces[0].notice == "" and traces[1].notice == ""  # nothing was left out while it fitted


def test_a_message_too_long_on_its_own_is_refused_and_the_history_stays(engine, config) -> None:
    conversation = Conversation()
    reply(conversation, engine, config, "My name is Ada.")
    with pytest.raises(PromptTooLongError, match=f"needs \\d+ tokens but the context holds {N_CTX}"):
        list(conversation.reply(engine, config, "X " * 700))
    assert len(conversation.turns) == 1 and conversation.dropped == 0  # nothing changed
    after = reply(conversation, engine, config, "ok?")
    assert "My name is Ada." in after.header["prompt_text"] and after.notice == ""


def test_saved_conversation_loads_back_in_order(engine, config, tmp_path) -> None:
    from localspec.app.trace import Trace

    conversation = Conversation()
    for text in ("Hi!", "Name a colour."):
        reply(conversation, engine, config, text)
    saved = conversation.save(tmp_path / "chat.jsonl", config)
    loaded = Trace.load(tmp_path / "chat.jsonl")
    assert loaded.events == saved.events and [e["kind"] for e in loaded.events][0] == "turn"
    assert [m["content"] for m in loaded.header["conversation"]] == [
        "Hi!",
        conversation.turns[0].reply,
        "Name a colour.",
        conversation.turns[1].reply,
    ]
    with pytest.raises(Exception, match="does not exist"):
        conversation.save(tmp_path / "missing" / "chat.jsonl", config)
    assert not (tmp_path / "missing").exists()


def test_user_text_that_utf8_cannot_encode_becomes_the_replacement_character() -> None:
    from localspec.app.usertext import clean

    assert clean("plain text, ünïcödé and 😀") == "plain text, ünïcödé and 😀"  # valid text is untouched
    assert clean("\ud800 hi \udfff") == "\ufffd hi \ufffd"  # lone surrogates from JSON
    undecodable = b"x\xff\xfey".decode("utf-8", "surrogateescape")  # bytes read with surrogateescape
    assert clean(undecodable) == "x\ufffd\ufffdy" and clean(undecodable).encode("utf-8")
