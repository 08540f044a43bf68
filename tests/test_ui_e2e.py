"""End to end: `python -m localspec ui` in a subprocess, driven over HTTP with gradio_client."""

from __future__ import annotations

import ipaddress
import json
import re
import time

import httpx
import psutil
import pytest
from gradio_client import Client
from gradio_client.utils import Status

pytestmark = pytest.mark.models

STATUS = re.compile(r'class="ls-tok ls-(\w+)[^"]*" data-status="(\w+)"')


def chat(client: Client, message: str, seed: int, max_tokens: int = 24, mode: str = "rejection"):
    # message, mode, temperature, top-k, top-p, min-p, K, seed, max tokens, system prompt
    return client.submit(message, mode, 0.7, 0, 1.0, 0.0, 4, seed, max_tokens, "", False, api_name="/chat")


def test_streamed_reply_carries_per_token_statuses(ui_server):
    url, proc, log = ui_server
    client = Client(url, verbose=False)
    job = chat(client, "Name three animals.", seed=4)
    updates = [output[0] for output in job]  # every streamed (chat, stats, notice) update
    final_chat, stats, notice = job.outputs()[-1]
    assert notice == ""
    spans = STATUS.findall(final_chat)
    assert all(cls == status for cls, status in spans), [pair for pair in spans if pair[0] != pair[1]]
    statuses = [status for _, status in spans]
    assert statuses, final_chat[:500]
    assert set(statuses) <= {"accepted", "corrected", "bonus", "target"} and "accepted" in statuses
    counts = [len(STATUS.findall(html)) for html in updates]
    assert any(0 < c < len(statuses) for c in counts), f"reply did not stream: span counts per update {counts}"
    assert 'data-stat="tps"' in stats and re.search(r'data-stat="acc"><div class="ls-card-v">\d+%', stats)


def test_ui_listens_on_loopback_only_and_prints_its_url(ui_server):
    url, proc, log = ui_server
    log.seek(0)
    assert f"localspec UI: {url}" in log.read()
    connections = psutil.Process(proc.pid).net_connections(kind="inet")
    listening = [c for c in connections if c.status == psutil.CONN_LISTEN]
    assert listening, "the UI process listens on no socket"
    for conn in listening:
        assert ipaddress.ip_address(conn.laddr.ip).is_loopback, f"listening on {conn.laddr}"
    for conn in connections:
        if conn.raddr:
            assert ipaddress.ip_address(conn.raddr.ip).is_loopback, f"connection to {conn.raddr}"


def wait_for(condition, what: str, guard_s: float = 120) -> None:
    """Poll a condition the server will reach; the guard only turns a hang into a clear failure."""
    give_up = time.monotonic() + guard_s
    while not condition():
        assert time.monotonic() < give_up, f"never saw {what}"
        time.sleep(0.02)


def test_a_second_conversation_queues_behind_the_first(ui_server):
    """Ordered by events: the second request is sent once the first streams, and is seen
    waiting in the queue while the first goes on streaming; it runs only when the first
    is stopped (the `/stop` endpoint: what the Stop button does)."""
    url, proc, log = ui_server
    first, second = Client(url, verbose=False), Client(url, verbose=False)
    # target-only and greedy on a prompt the demo target answers for thousands of tokens without an EOS
    job1 = first.submit("Tell me about the moon.", "target-only", 0.0, 0, 1.0, 0.0, 4, 1, 3000, "", False,
                        api_name="/chat")  # fmt: skip
    wait_for(lambda: len(job1.outputs()) > 0, "the first reply streaming")
    job2 = chat(second, "Tell me about the sun.", seed=2, max_tokens=24)
    wait_for(lambda: job2.status().code == Status.IN_QUEUE, "the second request in the queue")
    queued_at = len(job1.outputs())
    wait_for(lambda: len(job1.outputs()) >= queued_at + 3, "the first reply streaming on after the second queued")
    assert job2.outputs() == [] and job2.status().code == Status.IN_QUEUE, "the second must wait for the first"
    first.predict(api_name="/stop")  # the Stop button, for this client's own reply
    wait_for(job1.done, "the first reply to end after Stop")
    first_reply = job1.outputs()[-1][0]
    assert "ls-chip-stop" in first_reply and len(STATUS.findall(first_reply)) < 3000, "Stop ended it, not the length"
    wait_for(job2.done, "the second reply after the first was stopped")
    chat_html, _stats, notice = job2.outputs()[-1]
    assert notice == "" and STATUS.search(chat_html)


def test_a_page_that_leaves_mid_reply_ends_it(ui_server):
    """The page reads a reply's updates from one response (``/localspec/stream``) to the reply's end; a
    client that closes it mid-reply is a tab gone away, and the server ends the reply within a step
    instead of letting it run on to its length and hold the engine."""
    url, proc, log = ui_server
    client = Client(url, verbose=False)
    # target-only and greedy on a prompt the demo target answers for thousands of tokens without an EOS
    job = client.submit("Tell me about the moon.", "target-only", 0.0, 0, 1.0, 0.0, 4, 1, 3000, "", False,
                        api_name="/chat")  # fmt: skip
    wait_for(lambda: re.search(r'data-reply="([^"]+)"', (job.outputs() or [("",)])[-1][0]), "the reply started")
    reply = re.search(r'data-reply="([^"]+)"', job.outputs()[-1][0]).group(1)
    with httpx.stream("GET", f"{url}/localspec/stream", params={"reply": reply}, timeout=60) as answer:
        assert answer.headers["x-accel-buffering"] == "no"  # a proxy in front passes each line on as it comes
        first = json.loads(next(answer.iter_lines()))
    assert first["done"] is False and "stats" in first
    wait_for(job.done, "the reply to end once its reader left")
    final = job.outputs()[-1][0]
    assert "ls-chip-stop" in final and len(STATUS.findall(final)) < 3000, "the page leaving ended it, not its length"
