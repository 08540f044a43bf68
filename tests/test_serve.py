"""`localspec serve`: the OpenAI-compatible API, through real clients (the `openai` package, raw HTTP).

Each server runs in a subprocess on a free port (demo pair) and is ready when
it prints its URL line. Queueing and disconnects are driven by events (the
first streamed chunk, the server's own /health counters), never by a clock.
"""

from __future__ import annotations

import json
import statistics
import threading
import time

import httpx
import psutil
import pytest

from .conftest import TEST_THREADS, run_cli, running_server, server_env

pytestmark = [pytest.mark.models, pytest.mark.xdist_group("servers")]  # not beside the browser tests (loadgroup)
KEY = "test-key-123"
PROMPT = "Write one sentence about the sea."


def start(tmp_path_factory, *extra: str):
    args = ["serve", "--port", "0", "--ctx", "2048", "--threads", str(TEST_THREADS), "--pair", "demo", *extra]
    log_path = tmp_path_factory.mktemp("serve") / "server.log"
    return running_server(args, "localspec API: ", log_path, server_env())


@pytest.fixture(scope="module")
def server(demo_paths, tmp_path_factory):
    """A server with an API key and room for one waiting request; yields (base URL, process)."""
    with start(tmp_path_factory, "--api-key", KEY, "--queue-limit", "1") as (line, proc, _):
        assert "; both models on the CPU (" in line, line  # the ready line says where the pair computes
        yield line.split()[2], proc


def client(base: str):
    from openai import OpenAI

    return OpenAI(base_url=base, api_key=KEY, max_retries=0, timeout=120)


def post(base: str, path: str, body, key: str | None = KEY, **kwargs) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if isinstance(body, (dict, list)):
        return httpx.post(base + path, json=body, headers=headers, timeout=120, **kwargs)
    return httpx.post(base + path, content=body, headers={**headers, "Content-Type": "application/json"}, timeout=120)


# ---------------------------------------------------------------------------
def test_openai_client_streams_a_chat_completion_with_every_tokens_fate(server) -> None:
    base, _ = server
    stream = client(base).chat.completions.create(
        model="demo", messages=[{"role": "user", "content": PROMPT}], max_tokens=24, temperature=0.7, seed=5,
        stream=True, stream_options={"include_usage": True})  # fmt: skip
    text, fates, finish, usage, summary = "", [], None, None, None
    for chunk in stream:
        extra = chunk.model_extra.get("localspec") or {}
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
            fates += extra.get("tokens", [])
            summary = extra if "drafted" in extra else summary
        if chunk.usage:
            usage = chunk.usage
    assert text and "".join(f["text"] for f in fates) == text
    assert {f["status"] for f in fates} <= {"accepted", "corrected", "bonus", "target"}
    assert any(f["status"] == "accepted" for f in fates)
    accepted = [f for f in fates if f["status"] == "accepted"]
    assert all(f["q"] > 0 and (f["p"] is None) == (f["accept_prob"] is None) for f in accepted)
    assert all(0.0 <= f["accept_prob"] <= 1.0 for f in accepted if f["accept_prob"] is not None)  # null: decided
    # from bounds of the row's total, without p
    assert finish in ("stop", "length") and usage.completion_tokens == len(fates)
    assert summary["drafted"] >= summary["accepted"] > 0 and 0 < summary["acceptance_rate"] <= 1
    assert summary["tokens_per_step"] > 1
    # against the target under the reply's own conditions (or its best timing for a reply of few steps)
    assert summary["speedup"] is not None and summary["speedup"] > 0


def test_greedy_through_the_api_equals_localspec_generate(server) -> None:
    base, _ = server
    reply = client(base).chat.completions.create(
        model="demo", messages=[{"role": "user", "content": PROMPT}], max_tokens=32, temperature=0,
        extra_body={"mode": "greedy"})  # fmt: skip
    cli = run_cli("generate", PROMPT, "--pair", "demo", "--mode", "greedy", "-t", "0", "--max-tokens", "32")
    assert cli.returncode == 0, cli.stderr
    assert reply.choices[0].message.content == cli.stdout.rstrip("\n")
    assert reply.model_extra["localspec"]["mode"] == "greedy"


def test_invariant_mode_is_reproducible_whatever_the_draft(server) -> None:
    """The API's reproducible mode: the same seed gives the text `localspec generate` gives with no draft."""
    base, _ = server
    reply = client(base).chat.completions.create(
        model="demo", messages=[{"role": "user", "content": PROMPT}], max_tokens=24, temperature=0.8, seed=7,
        extra_body={"mode": "invariant"})  # fmt: skip
    alone = run_cli("generate", PROMPT, "--pair", "demo", "--draft", "none", "--mode", "invariant", "-t", "0.8",
                    "--seed", "7", "--max-tokens", "24")  # fmt: skip
    assert alone.returncode == 0, alone.stderr
    assert reply.choices[0].message.content == alone.stdout.rstrip("\n")
    assert reply.model_extra["localspec"]["drafted"] > 0  # the API's reply did use its draft


def test_a_request_can_ask_for_its_trace(server) -> None:
    from localspec.app.trace import Trace

    base, _ = server
    reply = post(base, "/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
                                              "trace": True}).json()  # fmt: skip
    trace = Trace.load(reply["localspec"]["trace"])
    assert trace.text == reply["choices"][0]["message"]["content"]
    assert len(trace.tokens) == reply["usage"]["completion_tokens"]


def test_completions_models_and_health(server) -> None:
    base, _ = server
    models = client(base).models.list()
    assert [m.id for m in models.data] == ["demo"]
    done = client(base).completions.create(model="demo", prompt="The capital of France is", max_tokens=8, temperature=0)
    assert done.choices[0].text and done.choices[0].finish_reason in ("stop", "length")
    assert done.usage.completion_tokens <= 8
    assert httpx.get(base.removesuffix("/v1") + "/health").json()["status"] == "ok"


@pytest.mark.parametrize(
    "body, status, param",
    [
        (b"{not json", 400, None),
        ({"messages": "hello"}, 422, "messages"),
        ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, 400, "max_tokens"),
        ({"messages": [{"role": "user", "content": "hi"}], "temperature": 99}, 400, "temperature"),
        ({"messages": [{"role": "user", "content": "hi"}], "n": 2}, 400, "n"),
        ({"messages": [{"role": "user", "content": "hi"}], "model": "gpt-9"}, 404, "model"),
        ({"messages": [{"role": "user", "content": "word " * 3000}]}, 400, "messages"),
        ({"messages": [{"role": "user", "content": "x" * (1100 * 1024)}]}, 413, None),
    ],
)
def test_bad_requests_get_openai_style_errors_and_the_server_keeps_serving(server, body, status, param) -> None:
    base, _ = server
    answer = post(base, "/chat/completions", body)
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param
    ok = post(base, "/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] is not None


def test_a_key_is_required_when_configured(server) -> None:
    base, _ = server
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert post(base, "/chat/completions", body, key=None).status_code == 401
    wrong = post(base, "/chat/completions", body, key="wrong")
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
    assert post(base, "/chat/completions", body).status_code == 200


def wait_for(base: str, predicate) -> dict:
    """Read /health until ``predicate`` holds (the server's own state: an event, not a clock)."""
    while True:
        health = httpx.get(base.removesuffix("/v1") + "/health").json()
        if predicate(health):
            return health
        time.sleep(0.02)  # a poll interval, not a deadline: the condition decides


def test_queue_limit_503_and_a_disconnect_frees_the_engine(server) -> None:
    """A long reply streams; a second request waits; a third is refused with 503 and Retry-After. The
    first client disconnects: its generation stops within a step and the waiting request runs."""
    base, _ = server
    # target-only and greedy on a prompt the demo target answers for thousands of tokens without an EOS
    long = {"messages": [{"role": "user", "content": "Tell me about the moon."}], "max_tokens": 1900,
            "temperature": 0, "stream": True, "mode": "target-only"}  # fmt: skip
    headers = {"Authorization": f"Bearer {KEY}"}
    second: dict = {}

    def run_second() -> None:
        answer = post(
            base, "/chat/completions", {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 6}
        )
        second["status"], second["body"] = answer.status_code, answer.json()

    with (
        httpx.Client(timeout=120) as http,
        http.stream("POST", base + "/chat/completions", json=long, headers=headers) as first,
    ):
        lines = first.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))  # the first reply streams
        waiting = threading.Thread(target=run_second)
        waiting.start()
        wait_for(base, lambda h: h["waiting"] == 1)
        refused = post(base, "/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert refused.status_code == 503 and int(refused.headers["Retry-After"]) >= 1
        assert refused.json()["error"]["code"] == "queue_full"
    # the stream is closed: the second request gets the engine
    waiting.join(120)
    assert second["status"] == 200 and second["body"]["choices"][0]["message"]["content"]
    health = wait_for(base, lambda h: not h["running"])
    assert health["waiting"] == 0


# ---------------------------------------------------------------------------
def test_soak_concurrent_streaming_clients(demo_paths, tmp_path_factory) -> None:
    """8 clients x 5 streaming requests, room for 4 waiting: each completes or gets a clean 503, no reply
    carries another's tokens (each equals the same request run alone), memory settles."""
    clients, per_client = 8, 5
    with start(tmp_path_factory, "--queue-limit", "4") as (line, proc, _):
        base = line.split()[2]
        rss = psutil.Process(proc.pid)
        warm = post(
            base, "/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}, key=None
        )
        assert warm.status_code == 200
        before = rss.memory_info().rss
        results: list[tuple[int, int, int | None, str, float | None]] = []
        lock = threading.Lock()

        def one_client(c: int) -> None:
            for r in range(per_client):
                n = c * per_client + r
                body = {"messages": [{"role": "user", "content": f"Say the number {n} and nothing else."}],
                        "max_tokens": 8, "temperature": 0, "stream": True}  # fmt: skip
                started, first, text, status = time.perf_counter(), None, "", 0
                with httpx.stream("POST", base + "/chat/completions", json=body, timeout=300) as answer:
                    status = answer.status_code
                    for line in answer.iter_lines():
                        if line.startswith("data: {"):
                            data = json.loads(line[6:])
                            if data.get("choices") and data["choices"][0]["delta"].get("content"):
                                first = first or time.perf_counter() - started
                                text += data["choices"][0]["delta"]["content"]
                with lock:
                    results.append((c, r, status, text, first))

        threads = [threading.Thread(target=one_client, args=(c,)) for c in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(600)
        after = rss.memory_info().rss
        assert len(results) == clients * per_client
        statuses = [status for _, _, status, _, _ in results]
        assert set(statuses) <= {200, 503}, statuses
        served = [(c * per_client + r, text, first) for c, r, s, text, first in results if s == 200]
        assert len(served) >= clients  # at least one per client got through
        for n, text, _ in served[:8]:  # each reply is what the same request gives alone: nothing leaked
            alone = post(base, "/chat/completions",
                         {"messages": [{"role": "user", "content": f"Say the number {n} and nothing else."}],
                          "max_tokens": 8, "temperature": 0}, key=None)  # fmt: skip
            assert alone.json()["choices"][0]["message"]["content"] == text
        final = post(
            base, "/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}, key=None
        )
        assert final.status_code == 200
        firsts = sorted(f for _, _, f in served if f is not None)
        p50, p95 = statistics.median(firsts), firsts[int(0.95 * (len(firsts) - 1))]
        print(f"\nsoak: {len(results)} requests, {clients} clients, {statuses.count(200)} served, "
              f"{statuses.count(503)} x 503, time to first token p50 {p50:.2f} s p95 {p95:.2f} s, "
              f"RSS {before / 2**20:.0f} -> {after / 2**20:.0f} MiB")  # fmt: skip
        assert after < before + 150 * 2**20


def stream_fates(base: str, model: str, key: str = KEY) -> tuple[str, list[dict]]:
    from openai import OpenAI

    stream = OpenAI(base_url=base, api_key=key, max_retries=0, timeout=300).chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Write a Python function that adds two numbers."}],
        max_tokens=24, temperature=0.7, seed=3, stream=True)  # fmt: skip
    text, fates = "", []
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            fates += (chunk.model_extra.get("localspec") or {}).get("tokens", [])
    return text, fates


def test_openai_client_on_the_real_pair(real_paths, tmp_path_factory) -> None:
    from .conftest import REAL_PAIR

    args = ["serve", "--port", "0", "--threads", str(TEST_THREADS), "--pair", REAL_PAIR]
    log_path = tmp_path_factory.mktemp("serve-real") / "server.log"
    with running_server(args, "localspec API: ", log_path, server_env()) as (line, _, _):
        text, fates = stream_fates(line.split()[2], REAL_PAIR, key="unused")
    assert text and "".join(f["text"] for f in fates) == text
    assert {f["status"] for f in fates} <= {"accepted", "corrected", "bonus", "target"}


def test_ui_and_api_in_one_process(demo_paths, tmp_path_factory) -> None:
    """`localspec ui --api`: the chat page and the API answer on one address, from one loaded pair."""
    from .conftest import _free_port

    port = _free_port()
    args = ["ui", "--api", "--port", str(port), "--threads", str(TEST_THREADS), "--pair", "demo"]
    log_path = tmp_path_factory.mktemp("ui-api") / "server.log"
    with running_server(args, "localspec UI: ", log_path, server_env()) as (line, _, log):
        base = f"http://127.0.0.1:{port}"
        assert f"localspec API: {base}/v1" in log.read()
        assert "; both models on the CPU (" in line  # where the pair computes, in the line a user reads first
        text, fates = stream_fates(base + "/v1", "demo")
        assert text and fates
        assert httpx.get(base + "/v1/models").json()["data"][0]["id"] == "demo"
        page = httpx.get(base + "/")
        assert page.status_code == 200 and "gradio" in page.text.lower()


def test_the_ui_starts_with_a_pair_that_does_not_load_and_says_why_where_it_was_started(tmp_path) -> None:
    """A pair that does not load leaves the page up (its Model pair panel loads another); the terminal that
    started it reads why, before the ready line, not only the page."""
    from .conftest import _free_port

    port = _free_port()
    args = ["ui", "--port", str(port), "--target", str(tmp_path / "gone.gguf"), "--draft", str(tmp_path / "d.gguf")]
    with running_server(args, "localspec UI: ", tmp_path / "server.log", server_env()) as (line, _, log):
        said = log.read()
        assert "(not loaded)" in line and "both models" not in line
        assert said.index("the pair did not load: ") < said.index("localspec UI: "), said
        assert "gone.gguf" in said.split("the pair did not load: ")[1].splitlines()[0]
        assert httpx.get(f"http://127.0.0.1:{port}/").status_code == 200


def test_text_that_is_not_valid_unicode_gets_a_reply_and_unknown_routes_an_api_error(server) -> None:
    """A lone surrogate is valid JSON ("\\ud800") but no UTF-8: it becomes U+FFFD, the request is answered
    and the connection serves on; an unknown route or method answers in the API's error shape."""
    base, _ = server
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    lone = b'{"messages": [{"role": "user", "content": "\\ud800 hi \\udfff"}], "max_tokens": 6}'
    with httpx.Client(timeout=120, headers=headers) as http:  # one connection for every request below
        answer = http.post(base + "/chat/completions", content=lone)
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"] is not None
        raw = http.post(base + "/completions", content=b'{"prompt": "\\udc80 x", "max_tokens": 4}')
        assert raw.status_code == 200, raw.text
        for response, status, code in ((http.get(base.removesuffix("/v1") + "/nope"), 404, "not_found"),
                                       (http.get(base + "/chat/completions"), 405, "method_not_allowed")):  # fmt: skip
            assert response.status_code == status and response.json()["error"]["code"] == code, response.text
            assert set(response.json()["error"]) == {"message", "type", "param", "code"}
        after = http.post(
            base + "/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        )
        assert after.status_code == 200
