"""`localspec chat` driven like a user drives it: the real program in a pseudo-terminal (pexpect).

Every test spawns ``python -m localspec chat`` on the demo pair, types into
it, and reads what a terminal would show. What the screen shows is checked
against the trace the chat itself saves (/save), so the colours and markers
must match the real token fates, not just "look coloured".
"""

from __future__ import annotations

import json
import os
import re
import sys

import pexpect
import pytest

from localspec.app.trace import Trace
from localspec.cli.term_render import TokenStyle
from localspec.core.events import TokenStatus

from .conftest import DRAFT, ROOT, TARGET, require, run_cli

pytestmark = pytest.mark.models

PROMPT = "you>"  # prompt_toolkit draws the trailing space as a cursor move, so match without it
STATS = re.compile(r"\[(\d+) tokens · ([\d.]+) tok/s(.*?) · prompt (\d+) \((\d+) new\) · stop: (\w+)\]")
COLOUR_SGR = re.compile(r"\x1b\[[0-9;]*(?:3[0-7]|9[0-7]|38;[0-9;]+)m")  # any foreground colour
BASE_ARGS = ("--ctx", "1024", "--threads", "1")


@pytest.fixture(scope="module", autouse=True)
def _models_present():
    require(TARGET, DRAFT)


def spawn_chat(*args: str, env: dict[str, str] | None = None, timeout: float = 180):
    full_env = {**os.environ, "TERM": "xterm-256color", "PROMPT_TOOLKIT_NO_CPR": "1"}
    full_env.pop("NO_COLOR", None)
    full_env.update(env or {})
    child = pexpect.spawn(
        sys.executable,
        ["-m", "localspec", "chat", *BASE_ARGS, *args],
        cwd=str(ROOT),
        env=full_env,
        dimensions=(40, 160),
        encoding="utf-8",
        codec_errors="replace",
        timeout=timeout,
    )
    child.expect_exact(PROMPT)  # models loaded, banner shown
    return child


def command(child, text: str, *expected: str) -> str:
    """Send a slash command, wait for its output (regexes, in order) and the next prompt; return what it showed."""
    child.sendline(text)
    shown = ""
    for pattern in expected:
        child.expect(pattern)
        shown += child.before + child.after
    child.expect_exact(PROMPT)
    return shown + child.before


def ask(child, text: str):
    """Type a message; return (screen text of the reply, stats match)."""
    child.sendline(text)
    child.expect(STATS)
    screen = child.before
    stats = child.match
    child.expect_exact(PROMPT)
    return screen, stats


def screen_text(raw: str) -> str:
    return raw.replace("\r\n", "\n")


def expected_render(tokens: list[dict], style: TokenStyle) -> str:
    return "".join(style.token(t["text"], TokenStatus(t["status"])) for t in tokens)


def tokens_by_turn(path) -> list[list[dict]]:
    """Token lines of a saved chat, split at the ``turn`` marker lines."""
    turns: list[list[dict]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        obj = json.loads(line)
        if obj["kind"] == "turn":
            turns.append([])
        elif obj["kind"] == "token":
            turns[-1].append(obj)
    return turns


def quit_cleanly(child) -> None:
    child.sendline("/quit")
    child.expect(pexpect.EOF, timeout=60)
    child.close()
    assert child.exitstatus == 0, child.before


# ----------------------------------------------------------------------
def test_two_turns_colours_kv_reuse_and_save(tmp_path) -> None:
    child = spawn_chat("--temperature", "0", "--max-tokens", "24")
    legend = screen_text(child.before)
    assert "legend:" in legend and "\x1b[32maccepted" in legend and "\x1b[31mcorrected" in legend
    assert re.search(r"both models on the CPU \(.+, 1 threads\)", legend), legend  # where the pair computes

    reply1, stats1 = ask(child, "What is the capital of France? Answer in one sentence.")
    reply2, stats2 = ask(child, "And the capital of Italy?")
    n_prompt1, n_prompt2, new2 = int(stats1.group(4)), int(stats2.group(4)), int(stats2.group(5))
    assert n_prompt2 > n_prompt1
    # KV state kept: the second turn evaluates only what the first one did not already hold
    assert new2 <= n_prompt2 - n_prompt1, (stats1.group(0), stats2.group(0))
    assert "acceptance" in stats1.group(3) and "tokens/step" in stats1.group(3)
    assert "x vs target alone" in stats1.group(3)

    saved = tmp_path / "chat.jsonl"
    command(child, f"/save {saved}", r"saved \d+ turn")
    quit_cleanly(child)

    trace = Trace.load(saved)
    conversation = trace.header["conversation"]
    assert [m["role"] for m in conversation] == ["user", "assistant", "user", "assistant"]
    assert conversation[2]["content"] == "And the capital of Italy?"
    assert "Paris" in conversation[1]["content"] and "Rome" in conversation[3]["content"]
    assert trace.result is not None and trace.steps
    turns = tokens_by_turn(saved)
    assert len(turns) == 2
    colour = TokenStyle(colour=True, markers=False)
    for number, (tokens, reply) in enumerate(zip(turns, (reply1, reply2))):
        assert "".join(t["text"] for t in tokens) == conversation[2 * number + 1]["content"]
        # the screen shows exactly these tokens, each in the colour of its recorded fate
        assert expected_render(tokens, colour) in screen_text(reply)
    statuses = {t["status"] for turn in turns for t in turn}
    assert "accepted" in statuses  # so the green check above was exercised


def test_no_color_shows_markers_instead(tmp_path) -> None:
    child = spawn_chat("--temperature", "0", "--max-tokens", "40", env={"NO_COLOR": "1"})
    banner = child.before
    assert "[corrected]" in banner and "{bonus}" in banner
    reply, stats = ask(child, "List three fruits.")
    saved = tmp_path / "plain.jsonl"
    command(child, f"/save {saved}", r"saved \d+ turn")
    child.sendeof()  # Ctrl-D at the prompt leaves cleanly
    child.expect(pexpect.EOF, timeout=60)
    child.close()
    assert child.exitstatus == 0
    assert not COLOUR_SGR.search(banner + reply + stats.group(0)), repr(reply)

    (tokens,) = tokens_by_turn(saved)
    assert expected_render(tokens, TokenStyle(colour=False, markers=True)) in screen_text(reply)
    assert any(t["status"] in ("bonus", "corrected") for t in tokens)  # markers were really drawn
    assert re.search(r"[\[{]", reply)


def test_slash_commands() -> None:
    child = spawn_chat("--max-tokens", "8", "--seed", "1")
    shown = command(child, "/help", r"/stats", r"mode rejection")
    assert "/save" in shown and "/quit" in shown

    command(child, "/temp warm", r"/temp needs a number")
    command(child, "/temp 99", r"error: .*temperature.* out of range")
    command(child, "/temp 0", r"T 0 ·")
    command(child, "/k 2", r"K 2 ·")
    command(child, "/mode turbo", r"error: .*'turbo'.*rejection")
    command(child, "/frobnicate now", r"unknown command /frobnicate; type /help")
    command(child, "/stats", r"no replies yet")

    _, first = ask(child, "Hi!")
    table = command(child, "/stats", r"draft position +drafted +accepted +rate")
    table = table[table.index("draft position") :]
    # K = 2 took effect: the table has rows for positions 1 and 2 only
    rows = re.findall(r"^\s+(\d+)\s+(\d+)\s+(\d+)\s+\d+%", screen_text(table), re.M)
    assert [r[0] for r in rows] == ["1", "2"], table

    missing = ROOT / "no-such-folder-for-save"
    command(child, f"/save {missing}/chat.jsonl", r"error: .*does not exist")
    assert not missing.exists()  # a typo in a folder name creates nothing
    command(child, "/reset", r"conversation cleared")
    _, after_reset = ask(child, "Hi!")
    assert after_reset.group(4) == first.group(4)  # the prompt is the first turn's again: history forgotten

    # /k 0 reaches the loop as K = 0 (not the loaded config's adaptive minimum of 1): a reply, no error
    command(child, "/k 0", r"K 0 ·")
    screen, _ = ask(child, "Hi!")
    assert "error" not in screen, screen
    quit_cleanly(child)


def test_ctrl_c_stops_a_long_reply_and_the_chat_goes_on(tmp_path) -> None:
    child = spawn_chat("--max-tokens", "600", "--seed", "5", "--temperature", "0.7")
    child.sendline("Write a very long story about a dragon who learns to bake bread.")
    child.expect(r"\x1b\[(32|31|94)m")  # the first token is on screen: Ctrl-C now
    child.sendintr()
    child.expect_exact("stopped: the partial reply is kept")
    child.expect(STATS)
    stats = child.match
    assert stats.group(6) == "cancelled"
    assert 0 < int(stats.group(1)) < 600  # (the one-step bound itself is exact in test_loop and the UI tests)
    child.expect_exact(PROMPT)

    _, stats2 = ask(child, "Give the dragon a name, in one word.")
    assert stats2.group(6) in ("eos", "max_tokens")
    saved = tmp_path / "after_ctrl_c.jsonl"
    command(child, f"/save {saved}", r"saved \d+ turn")
    child.sendintr()  # Ctrl-C at the prompt leaves cleanly
    child.expect(pexpect.EOF, timeout=60)
    child.close()
    assert child.exitstatus == 0

    conversation = Trace.load(saved).header["conversation"]
    assert len(conversation) == 4
    partial = conversation[1]["content"]
    assert partial.strip(), "the partial reply is kept in the conversation"
    turns = tokens_by_turn(saved)
    assert "".join(t["text"] for t in turns[0]) == partial


def test_piped_input_gets_plain_text() -> None:
    result = run_cli("chat", *BASE_ARGS, "--temperature", "0", "--max-tokens", "16", input="Say hello.\n/stats\n")
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout
    assert result.stdout.strip()
    assert STATS.search(result.stderr), result.stderr
    assert "draft position" in result.stderr  # /stats output goes with the other notes, not into stdout


def test_missing_model_is_one_error_line(tmp_path) -> None:
    result = run_cli("chat", "--target", str(tmp_path / "nope.gguf"))
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "nope.gguf" in lines[0] and "localspec models prepare" in lines[0]


def test_input_that_is_not_utf8_gets_a_reply() -> None:
    """Bytes that are not UTF-8 on a pipe become U+FFFD; the chat answers and goes on to the next line."""
    import subprocess
    import sys

    line = b"Say \xff\xfe hello.\n" + b"Say hi.\n"
    done = subprocess.run([sys.executable, "-m", "localspec", "chat", *BASE_ARGS, "--temperature", "0", "--max-tokens",
                           "8", "--target", str(TARGET), "--draft", str(DRAFT)], input=line, capture_output=True,
                          cwd=ROOT, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert "Traceback" not in done.stderr.decode(errors="replace")
    assert done.stdout.decode("utf-8").strip()
