"""End to end: `python -m localspec ui` in a subprocess, driven over HTTP with gradio_client."""

from __future__ import annotations

import ipaddress
import re
import time

import psutil
import pytest
from gradio_client import Client

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


def test_a_second_conversation_queues_behind_the_first(ui_server):
    url, proc, log = ui_server
    first, second = Client(url, verbose=False), Client(url, verbose=False)
    job1 = chat(first, "Tell me about the moon.", seed=1, max_tokens=24)
    time.sleep(0.3)
    job2 = chat(second, "Tell me about the sun.", seed=2, max_tokens=24)
    queued = False
    while not job2.done():
        status = job2.status()
        if status.code.name == "IN_QUEUE" and not job1.done():
            queued = True
        time.sleep(0.05)
    assert queued, "the second conversation should wait in the queue while the first generates"
    for job in (job1, job2):
        chat_html, _stats, notice = job.outputs()[-1]
        assert notice == "" and STATUS.search(chat_html)
