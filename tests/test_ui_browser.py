"""A real Chromium (Debian's package, never a browser download) driving the UI with Playwright.

Screenshots go to artifacts/ (git-ignored): artifacts/ui-chat.png and
artifacts/ui-debug.png, for a human to look at.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT

# with the API soak test, the heaviest server tests: one worker runs them one after another (--dist loadgroup)
pytestmark = [pytest.mark.browser, pytest.mark.models, pytest.mark.xdist_group("servers")]

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip
ARTIFACTS = ROOT / "artifacts"


@pytest.fixture(scope="session")
def chromium() -> Path:
    """Debian's Chromium, installed with apt when missing (we are root; Playwright downloads nothing)."""
    if not CHROMIUM.exists():
        if shutil.which("apt-get") is None:
            pytest.fail("/usr/bin/chromium is missing and apt-get is not available; install Chromium")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        lock = ["-o", "DPkg::Lock::Timeout=600"]
        for command in (["apt-get", *lock, "update"], ["apt-get", *lock, "install", "-y", "chromium"]):
            done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
            if done.returncode != 0:
                pytest.fail(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    return CHROMIUM


@pytest.fixture(scope="module")
def page(chromium, ui_server):
    from playwright.sync_api import sync_playwright

    url, _proc, _log = ui_server
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(chromium), args=ARGS, headless=True)
        context = browser.new_context(viewport={"width": 1440, "height": 1000}, device_scale_factor=1)
        page = context.new_page()
        page.outside = []  # requests to anything but the local server
        page.on("request", lambda r: None if r.url.startswith((url, "data:", "blob:")) else page.outside.append(r.url))
        page.goto(url, wait_until="load")
        page.wait_for_selector("#ls-message textarea", timeout=60_000)
        yield page
        context.close()
        browser.close()


def test_chat_streams_coloured_tokens_and_debugging_tab_explains_them(page):
    page.locator("#ls-message textarea").fill("Write a short python function that adds two numbers.")
    page.locator("#ls-send").click()
    # the reply is done when tokens are on screen and the streaming cursor is gone
    page.wait_for_function(
        "document.querySelectorAll('#ls-chat-log .ls-assistant .ls-tok[data-status]').length > 0"
        " && !document.querySelector('#ls-chat-log .ls-cursor')",
        timeout=120_000,
    )
    tokens = page.locator("#ls-chat-log .ls-assistant .ls-tok[data-status]")
    assert tokens.count() > 3
    statuses = set(tokens.evaluate_all("els => els.map(e => e.dataset.status)"))
    assert statuses <= {"accepted", "corrected", "bonus", "target"} and "accepted" in statuses
    accepted = page.locator("#ls-chat-log .ls-assistant .ls-accepted").first
    background = accepted.evaluate("e => getComputedStyle(e).backgroundColor")
    assert background not in ("rgba(0, 0, 0, 0)", "transparent"), "accepted tokens must be tinted"
    underline = accepted.evaluate(
        "e => getComputedStyle(e).textDecorationLine + ' ' + getComputedStyle(e).textDecorationStyle"
    )
    assert underline == "underline solid", "colour is never the only cue: accepted tokens are underlined"
    accepted.hover()  # the evidence is read from the server when the token is hovered
    page.wait_for_selector("#ls-tip.ls-tip-on", timeout=30_000)
    assert "p(token)" in page.locator("#ls-tip").inner_text() and accepted.get_attribute("title") is None
    assert page.locator("#ls-legend .ls-tok").count() == 4
    page.wait_for_function("document.querySelector('#ls-stats [data-stat=tps] .ls-card-v').textContent !== '–'")
    page.screenshot(path=str(ARTIFACTS / "ui-chat.png"), full_page=True)

    # clicking a token opens the debugging view on that token
    clicked = tokens.nth(min(5, tokens.count() - 1))
    index = int(clicked.get_attribute("data-i"))
    clicked.click()
    page.wait_for_function(
        f"document.querySelector('#ls-top .ls-top-head') && "
        f"document.querySelector('#ls-top .ls-top-head').textContent.includes('token #{index + 1} ')",
        timeout=30_000,
    )
    page.locator("#ls-summary").wait_for(state="visible", timeout=10_000)  # the tab switched by itself
    page.wait_for_selector("#ls-steps table", timeout=30_000)
    assert "current reply" in page.locator("#ls-summary").inner_text()
    assert page.locator("#ls-top table.ls-top tr").count() >= 10
    page.wait_for_function(  # the three plots are painted
        "(() => { const imgs = [...document.querySelectorAll('.matplotlib img')];"
        " return imgs.length >= 3 && imgs.every(i => i.complete && i.naturalWidth > 0); })()",
        timeout=30_000,
    )
    page.screenshot(path=str(ARTIFACTS / "ui-debug.png"), full_page=True)
    assert page.outside == [], f"the page fetched from outside the local server: {page.outside[:5]}"
    assert (ARTIFACTS / "ui-chat.png").stat().st_size > 10_000
    assert (ARTIFACTS / "ui-debug.png").stat().st_size > 10_000


def test_a_second_tab_waits_and_its_stop_cancels_the_queued_request(page, ui_server):
    """Two tabs, one engine: the second waits; its Stop cancels its queued request.

    The first reply is greedy, on a prompt the demo pair answers without an
    EOS for 4,000 tokens (measured: a minute on two cores) — against the second
    tab's sub-second clicks; it ends only when its own Stop is pressed. Measured
    on an empty chat: after the previous test's turn (sampled with a fresh seed)
    the prompt differs, and with about one such turn in six the greedy reply
    ends with an EOS after 50-80 tokens, before it can outgrow the box.
    """
    url, _proc, _log = ui_server
    page.reload(wait_until="load")  # a new session: an empty chat, as measured
    page.wait_for_selector("#ls-message textarea", timeout=60_000)
    other = page.context.new_page()
    try:
        other.goto(url, wait_until="load")
        other.wait_for_selector("#ls-message textarea", timeout=60_000)
        page.get_by_role("tab", name="Chat").click()
        page.locator("#ls-mode input").click()
        page.get_by_role("option", name="greedy").click()  # greedy: this prompt runs on with no EOS
        page.locator("#ls-max-tokens input").fill("4000")
        page.locator("#ls-max-tokens input").press("Tab")
        before = page.locator("#ls-chat-log .ls-tok").count()
        page.locator("#ls-message textarea").fill("Tell me about rivers.")
        page.locator("#ls-send").click()
        # the first tab is streaming: new tokens are on screen (not just its "thinking" bubble, which
        # shows while its request may still wait for a queue worker)
        page.wait_for_function(
            f"document.querySelectorAll('#ls-chat-log .ls-tok').length > {before}"
            " && document.querySelector('#ls-chat-log .ls-cursor')",
            timeout=120_000,
        )

        other.locator("#ls-message textarea").fill("Tell me about mountains.")
        other.locator("#ls-send").click()
        waiting = other.locator("#ls-waiting")
        waiting.wait_for(timeout=60_000)
        assert "waiting for the other conversation" in waiting.inner_text()
        other.screenshot(path=str(ARTIFACTS / "ui-second-tab-waiting.png"))
        other.locator("#ls-stop").click()  # Stop while the request waits in the queue

        # the first reply grows longer than the chat box (an event, not a clock) before it is stopped
        try:
            page.wait_for_function(
                "(() => { const log = document.getElementById('ls-chat-log');"
                " return log && log.scrollHeight > log.clientHeight + 50; })()",
                timeout=180_000,
            )
        except Exception:
            page.locator("#ls-chat-log").screenshot(path=str(ARTIFACTS / "debug-first-tab-log.png"))
            print("LAST:", page.locator("#ls-chat-log").inner_text()[-600:])
            print("NOTICE:", page.locator("#ls-notice").inner_text() if page.locator("#ls-notice").count() else None)
            raise
        # the stats panel follows the reply while it streams (the same response brings tokens and stats)
        page.wait_for_function(
            "(() => { const v = document.querySelector('#ls-stats [data-stat=tps] .ls-card-v');"
            " return document.querySelector('#ls-chat-log .ls-cursor') && v && /\\d/.test(v.textContent); })()",
            timeout=60_000,
        )
        page.locator("#ls-stop").click()  # the first reply ends within one step and the queue moves on
        page.wait_for_function("!document.querySelector('#ls-chat-log .ls-cursor')", timeout=60_000)
        assert "stopped" in page.locator("#ls-chat-log .ls-assistant").last.inner_text()
        # the chat followed the reply down: the newest text is in view, not the oldest
        at_bottom = page.evaluate(
            "(() => { const log = document.getElementById('ls-chat-log');"
            " return log.scrollTop + log.clientHeight >= log.scrollHeight - 5; })()"
        )
        assert at_bottom, "the chat log must scroll with a reply longer than it"

        # the second tab's request started, saw its Stop and gave the message back, unanswered
        other.wait_for_function(
            "document.querySelector('#ls-notice') && document.querySelector('#ls-notice').textContent"
            ".includes('stopped before the reply began')",
            timeout=60_000,
        )
        assert other.locator("#ls-message textarea").input_value() == "Tell me about mountains."
        assert other.locator("#ls-chat-log .ls-assistant .ls-tok[data-status]").count() == 0
        assert other.locator("#ls-waiting").count() == 0

        other.locator("#ls-send").click()  # sent again, it is answered
        other.wait_for_function(
            "document.querySelectorAll('#ls-chat-log .ls-assistant .ls-tok[data-status]').length > 0"
            " && !document.querySelector('#ls-chat-log .ls-cursor') && !document.querySelector('#ls-waiting')",
            timeout=120_000,
        )
    finally:
        other.close()


# counts the animation frames the page asks for (installed before any of the page's scripts)
COUNT_FRAMES = """(() => { const frame = window.requestAnimationFrame.bind(window); window.lsFrames = 0;
  window.requestAnimationFrame = function (callback) { window.lsFrames++; return frame(callback); }; })()"""
IDLE_FRAMES_JS = "async () => { const before = window.lsFrames; await new Promise(r => setTimeout(r, 4000)); " \
                 "return window.lsFrames - before; }"  # fmt: skip


def test_an_idle_page_draws_no_frames(page, ui_server):
    """Issue 39: Gradio's status tracker ran a timer on every animation frame (60 a second) while the page
    sat idle, and on two shared cores the model paid for it. The page puts a script before Gradio's own
    that makes that timer tick every 5 s: over 4 s of an idle chat, at most one tick's short tween (about
    24 frames). Control: the same page with that script taken out of its HTML asks for a frame every
    1/60 s, twice over (the timer and its tween: about 480 in 4 s)."""
    url, _proc, _log = ui_server
    browser = page.context.browser  # the module's Chromium: one Playwright per process

    def idle_frames(strip_early_script: bool) -> int:
        context = browser.new_context(viewport={"width": 1440, "height": 1000})
        context.add_init_script(COUNT_FRAMES)
        if strip_early_script:

            def without(route):
                page_html = route.fetch().text()
                head = page_html.index("<head>") + len("<head>")
                assert page_html[head:].startswith("<script>"), "the early script must come first in the head"
                route.fulfill(body=page_html[:head] + page_html[page_html.index("</script>", head) + 9:],
                              content_type="text/html")  # fmt: skip

            context.route(url + "/", without)
        page = context.new_page()
        page.goto(url, wait_until="load")
        page.wait_for_selector("#ls-message textarea", timeout=60_000)
        page.wait_for_function("document.querySelector('#ls-stats-box')")
        page.evaluate(IDLE_FRAMES_JS)  # the page settles: Gradio's start-up waits a bounded number of frames
        frames = page.evaluate(IDLE_FRAMES_JS)
        context.close()
        return frames

    assert idle_frames(strip_early_script=False) <= 60
    assert idle_frames(strip_early_script=True) >= 150  # the control: Gradio alone
