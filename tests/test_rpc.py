"""A target split over llama.cpp RPC servers on loopback: the same tokens as the target alone, clear failures.

Two ``localspec rpc-server`` processes on 127.0.0.1 (free ports) hold the demo target's layers; the draft
stays local. Servers on this CPU run the same kernels on the same weights in plain memory as a local
model with its extra buffers off, so logits first (the doctor's probe across the split, and against the
local model), then greedy, rejection and invariant output token for token. Then the failures: an
endpoint that does not answer is named before anything loads; a server killed mid-reply ends the reply
with its name, the next request says it is still down, and once it is back the target is reloaded.
"""

from __future__ import annotations

import itertools
import signal
import threading
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np
import pytest

from localspec.app.invariance import row_count_diffs
from localspec.core.errors import LocalspecError
from localspec.core.events import TokenEvent
from localspec.core.sampling import SamplingParams

from .conftest import (
    DRAFT,
    QWEN_DRAFT,
    QWEN_TARGET,
    TARGET,
    TEST_THREADS,
    _free_port,
    generate,
    make_engine,
    require,
    run_cli,
    running_server,
    server_env,
)

pytestmark = [pytest.mark.models, pytest.mark.xdist_group("rpc")]

GREEDY = SamplingParams(temperature=0.0)
WARM = SamplingParams(temperature=0.8)


@contextmanager
def rpc_server(tmp_path: Path, port: int | None = None):
    """`localspec rpc-server` on a free loopback port; yields (endpoint, process) once it answers."""
    port = port or _free_port()
    args = ["rpc-server", "--port", str(port), "--threads", str(TEST_THREADS)]
    log = tmp_path / f"rpc-{port}.log"
    with running_server(args, "localspec rpc-server: listening on", log, server_env()) as (line, proc, _):
        assert line, log.read_text()
        yield f"127.0.0.1:{port}", proc


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    require(TARGET, DRAFT)
    folder = tmp_path_factory.mktemp("rpc")
    with ExitStack() as stack:
        yield [stack.enter_context(rpc_server(folder))[0] for _ in range(2)]


def test_the_output_layer_stays_here_so_no_logits_cross_the_network(servers) -> None:
    """model.rpc_output: "local" computes the output layer here, so each row costs the network a hidden state;
    "remote" (the default, and the control) brings back a row of logits per row. The logits are the same bits."""
    from localspec.bench.delay import DelayProxy
    from localspec.llama.model import LlamaModel, LlamaSettings

    proxies = [DelayProxy(endpoint, 0.0).start() for endpoint in servers]  # counts the bytes each way
    logits, received = {}, {}
    try:
        for output in ("local", "remote"):
            settings = LlamaSettings(n_ctx=512, threads=TEST_THREADS, rpc_servers=tuple(p.endpoint for p in proxies),
                                     rpc_output=output)  # fmt: skip
            model = LlamaModel(TARGET, settings)
            try:
                assert model.placement.offload.output_here == (output == "local")
                tokens = model.tokenize("Only a hidden state per row should cross the network. " * 2)
                before = sum(p.bytes_sent["server"] for p in proxies)
                logits[output] = np.asarray(model.extend(tokens, len(tokens)))
                received[output] = sum(p.bytes_sent["server"] for p in proxies) - before
            finally:
                model.close()
    finally:
        for proxy in proxies:
            proxy.stop()
    rows, vocab = logits["local"].shape
    assert received["remote"] >= rows * vocab * 4  # the control: every row's logits came back
    assert received["local"] < vocab * 4  # less than one row of logits for all the rows
    assert np.array_equal(logits["local"].view(np.uint32), logits["remote"].view(np.uint32))


def test_the_split_target_computes_the_local_target_s_logits(servers) -> None:
    from localspec.llama.model import LlamaModel, LlamaSettings

    remote = LlamaModel(TARGET, LlamaSettings(n_ctx=512, threads=TEST_THREADS, rpc_servers=tuple(servers)))
    local = LlamaModel(TARGET, LlamaSettings(n_ctx=512, threads=TEST_THREADS, extra_buffers=False))
    try:
        assert len([name for name in remote.weight_buffer_mib if name.startswith("RPC")]) == 2, remote.weight_buffer_mib
        tokens = remote.tokenize("Speculative decoding across machines must not change a single bit. " * 4)
        assert row_count_diffs(remote, tokens, (2, 3, 5, 9)) == {2: 0.0, 3: 0.0, 5: 0.0, 9: 0.0}
        remote.truncate(0)  # the same tokens from position 0 on both
        ours, theirs = remote.extend(tokens, len(tokens)), local.extend(tokens, len(tokens))
        assert np.array_equal(np.asarray(ours).view(np.uint32), np.asarray(theirs).view(np.uint32))
    finally:
        remote.close()
        local.close()


@pytest.mark.parametrize(("mode", "params"), [("greedy", GREEDY), ("rejection", WARM), ("invariant", WARM)])
def test_speculation_over_rpc_writes_the_local_tokens(servers, mode: str, params) -> None:
    remote = make_engine(TARGET, DRAFT, **{"model.rpc_servers": servers})
    local = make_engine(TARGET, DRAFT)  # an F32 target: the same kernels in plain memory as on the servers
    try:
        prompt = local.encode_raw("Three rivers in Europe are").tokens
        there, _ = generate(remote, prompt, params, mode=mode, max_tokens=40, seed=7)
        here, _ = generate(local, prompt, params, mode=mode, max_tokens=40, seed=7)
        assert there.token_ids == here.token_ids
        assert len(there.token_ids) >= 10  # several steps compared (a sampled reply may end before 40)
    finally:
        remote.close()
        local.close()


def test_an_endpoint_that_does_not_answer_is_named_before_anything_loads() -> None:
    closed = f"127.0.0.1:{_free_port()}"
    result = run_cli("generate", "--target", str(TARGET), "--draft", str(DRAFT), "--rpc", closed, "hi")
    assert result.returncode != 0
    message = result.stderr.strip().splitlines()
    assert len(message) == 1 and closed in message[0] and "does not answer" in message[0], result.stderr
    assert "localspec rpc-server" in message[0]


def test_a_bad_endpoint_is_a_config_error_naming_it() -> None:
    result = run_cli("generate", "--target", str(TARGET), "--rpc", "no-port-here", "hi")
    assert result.returncode != 0 and "'no-port-here' is not host:port" in result.stderr


def test_a_server_killed_mid_reply_ends_the_reply_and_the_target_comes_back(tmp_path) -> None:
    require(TARGET, DRAFT)
    port = _free_port()
    with rpc_server(tmp_path) as (steady, _), ExitStack() as stack:
        lost, proc = stack.enter_context(rpc_server(tmp_path, port))
        engine = make_engine(TARGET, DRAFT, **{"model.rpc_servers": [steady, lost]})
        try:
            prompt = engine.encode_raw("Counting from one to fifty in words: one, two,").tokens
            written = []
            with pytest.raises(LocalspecError) as ended:
                for event in engine.stream(prompt, engine.options(mode="greedy", max_tokens=200), GREEDY):
                    if isinstance(event, TokenEvent):
                        written.append(event)
                        if len(written) == 3:
                            proc.send_signal(signal.SIGKILL)  # the server dies mid-reply
                            proc.wait()
            assert lost in str(ended.value) and "stopped answering" in str(ended.value)
            assert len(written) >= 3  # what was written before stays written

            with pytest.raises(LocalspecError) as still_down:  # the next request says so, in one line
                list(engine.stream(prompt, engine.options(mode="greedy", max_tokens=8), GREEDY))
            assert lost in str(still_down.value) and "does not answer" in str(still_down.value)

            stack.close()
            with rpc_server(tmp_path, port):  # back on the same port: the next request reloads the target
                again, _ = generate(engine, prompt, GREEDY, mode="greedy", max_tokens=8)
                fresh = make_engine(TARGET, DRAFT, **{"model.rpc_servers": [steady, lost]})
                expected, _ = generate(fresh, prompt, GREEDY, mode="greedy", max_tokens=8)
                fresh.close()
                engine.close()  # before the servers stop
            assert again.token_ids == expected.token_ids and len(again.token_ids) == 8
        finally:
            engine.close()


def test_the_api_answers_through_a_server_s_death_and_reloads_when_it_is_back(tmp_path) -> None:
    """`localspec serve --rpc A --rpc B` through the openai client: a server killed mid-reply ends the stream
    with an error naming it, the next request answers 503 naming it while the API serves on, and once the
    server is back on its port the next request is answered in full."""
    import openai
    from openai import OpenAI

    require(TARGET, DRAFT)
    port = _free_port()
    prompt = "Counting from one to fifty in words: one, two,"
    with rpc_server(tmp_path) as (steady, _), ExitStack() as stack:
        lost, proc = stack.enter_context(rpc_server(tmp_path, port))
        args = [
            "serve",
            "--port",
            "0",
            "--pair",
            "demo",
            "--threads",
            str(TEST_THREADS),
            "--rpc",
            steady,
            "--rpc",
            lost,
        ]
        with running_server(args, "localspec API: ", tmp_path / "serve.log", server_env()) as (line, api, _):
            client = OpenAI(base_url=line.split()[2], api_key="none", max_retries=0, timeout=120)
            pieces = []
            with pytest.raises(openai.APIError) as ended:
                for chunk in client.completions.create(model="demo", prompt=prompt, max_tokens=200, temperature=0,
                                                       stream=True):  # fmt: skip
                    pieces.append(chunk.choices[0].text if chunk.choices else "")
                    if len(pieces) == 3:
                        proc.send_signal(signal.SIGKILL)  # the server dies mid-reply
                        proc.wait()
            assert lost in str(ended.value) and "stopped answering" in str(ended.value)
            assert "".join(pieces)  # what was written before came through

            with pytest.raises(openai.APIStatusError) as still_down:
                client.completions.create(model="demo", prompt=prompt, max_tokens=8, temperature=0)
            assert still_down.value.status_code == 503 and lost in still_down.value.message
            assert api.poll() is None and client.models.list().data  # the API serves on

            stack.close()
            with rpc_server(tmp_path, port):  # back on the same port: the next request reloads the target
                again = client.completions.create(model="demo", prompt=prompt, max_tokens=8, temperature=0)
            assert again.choices[0].text and again.usage.completion_tokens == 8


_LINKS = itertools.count()


@contextmanager
def server_behind_a_link(tmp_path: Path):
    """`localspec rpc-server` in a network namespace of its own, reached over a veth pair, so its link can go
    down as a pulled cable does: no FIN, no RST, packets just stop. Yields (endpoint, set_link(up)). Needs
    root and iproute2 (installed if missing, as the browser tests install Chromium)."""
    import os
    import shutil
    import subprocess

    if os.geteuid() != 0:
        pytest.fail("the vanished-server test needs root for a network namespace (ip netns)")
    if shutil.which("ip") is None:
        subprocess.run(["apt-get", "install", "-y", "-q", "iproute2"], check=True, capture_output=True)
    serial = next(_LINKS)  # each its own names and subnet: a deleted pair's names are freed asynchronously
    name = f"lsx{os.getpid() % 100000}{serial}"
    near, far = f"{name}a", f"{name}b"
    net = f"10.{213 + serial % 40}.{os.getpid() % 250}"

    def ip(*args: str, inside: bool = False) -> None:
        subprocess.run(["ip", *(["netns", "exec", name, "ip"] if inside else []), *args], check=True)

    ip("netns", "add", name)
    try:
        ip("link", "add", near, "type", "veth", "peer", "name", far)
        ip("link", "set", far, "netns", name)
        ip("addr", "add", f"{net}.1/30", "dev", near)
        ip("link", "set", near, "up")
        ip("addr", "add", f"{net}.2/30", "dev", far, inside=True)
        ip("link", "set", far, "up", inside=True)
        ip("link", "set", "lo", "up", inside=True)  # the server's own readiness probe goes through it
        args = ["rpc-server", "--host", f"{net}.2", "--port", "50052", "--threads", str(TEST_THREADS)]
        log = tmp_path / f"rpc-{name}.log"
        with running_server(args, "localspec rpc-server: listening on", log, server_env(),
                            prefix=("ip", "netns", "exec", name)) as (line, _, _):  # fmt: skip
            assert line, log.read_text()
            yield f"{net}.2:50052", lambda up: ip("link", "set", far, "up" if up else "down", inside=True)
    finally:
        subprocess.run(["ip", "link", "del", near], check=False, capture_output=True)  # and its peer with it
        subprocess.run(["ip", "netns", "del", name], check=False)


def _reply_in_thread(engine, prompt, on_token) -> tuple[threading.Thread, dict]:
    """A greedy reply of up to 200 tokens on a thread of its own: its tokens and error land in the dict."""
    outcome: dict = {"tokens": [], "error": None}

    def run() -> None:
        try:
            for event in engine.stream(prompt, engine.options(mode="greedy", max_tokens=200), GREEDY):
                if isinstance(event, TokenEvent):
                    outcome["tokens"].append(event)
                    on_token(len(outcome["tokens"]))
        except LocalspecError as error:
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


@pytest.mark.parametrize("dead_after_s", ["3", "0"])
def test_a_server_whose_link_goes_down_is_named_within_the_timeout(tmp_path, monkeypatch, dead_after_s) -> None:
    """A server that vanishes without closing its socket (its link down mid-reply): with
    LOCALSPEC_RPC_DEAD_AFTER_S=3 the reply ends within seconds naming it, where the recv used to wait for
    ever. The control, 0 (no keepalive): still waiting while the link is down, and once it is back up
    the reply goes on to its end."""
    from localspec.llama import rpc

    require(TARGET, DRAFT)
    monkeypatch.setenv("LOCALSPEC_RPC_DEAD_AFTER_S", dead_after_s)  # read by both ends when they connect
    with server_behind_a_link(tmp_path) as (endpoint, set_link):
        engine = make_engine(TARGET, DRAFT, **{"model.rpc_servers": [endpoint]})
        try:
            prompt = engine.encode_raw("Counting from one to fifty in words: one, two,").tokens
            cut = threading.Event()

            def pull_the_cable(count: int) -> None:
                if count == 3:
                    set_link(False)
                    cut.set()

            thread, outcome = _reply_in_thread(engine, prompt, pull_the_cable)
            assert cut.wait(120), (outcome, thread.is_alive())
            if dead_after_s != "0":
                thread.join(60)  # ten times the timeout: a reply still running here would wait for ever
                assert not thread.is_alive(), "the reply still waits for a server whose link is down"
                assert endpoint in str(outcome["error"]) and "stopped answering" in str(outcome["error"])
                engine.close()
                assert rpc.lost_server() is None  # the loss is forgotten with the model: later ones may connect
            else:
                thread.join(8)  # longer than the keepalive would take
                assert thread.is_alive() and outcome["error"] is None  # without it: waiting, no error
                set_link(True)
                thread.join(120)
                assert not thread.is_alive() and outcome["error"] is None and len(outcome["tokens"]) == 200
        finally:
            engine.close()


def test_the_real_pair_s_target_across_two_servers_writes_its_greedy_text(tmp_path, monkeypatch) -> None:
    """The servers keep weights in plain memory; the local target does too here (extra buffers off), so both
    run the same kernels."""
    require(QWEN_TARGET, QWEN_DRAFT)
    monkeypatch.setenv("LOCALSPEC_EXTRA_BUFFERS", "0")
    with rpc_server(tmp_path) as (first, _), rpc_server(tmp_path) as (second, _):
        remote = make_engine(QWEN_TARGET, QWEN_DRAFT, **{"model.rpc_servers": [first, second]})
        prompt = remote.encode_raw("def reverse(text: str) -> str:\n").tokens
        there, _ = generate(remote, prompt, GREEDY, mode="greedy", max_tokens=48)
        remote.close()
    local = make_engine(QWEN_TARGET, QWEN_DRAFT)
    here, _ = generate(local, prompt, GREEDY, mode="target-only", max_tokens=48)
    local.close()
    assert there.token_ids == here.token_ids


def test_the_rpc_bench_counts_round_trips_and_predicts_the_delay_s_cost(tmp_path) -> None:
    """`python -m localspec.bench rpc`: a local server behind a delaying proxy, the target alone and the default
    on each link, interleaved; every decode paid at least one round trip the proxy counted, and only with the
    output layer on the server did a row of logits per decode come back."""
    from .test_bench import bench_module

    runs, table = bench_module("rpc", "--servers", "1", "--delays", "0,2", "--outputs", "local,remote", "--prompts",
                               "chat", "--repeats", "1", "--max-tokens", "8", "--plot", str(tmp_path / "rpc.png"),
                               tmp_path=tmp_path)  # fmt: skip
    assert sorted({(r["delay_ms"], r["output"], r["variant"]) for r in runs}) == [
        (delay, output, variant)
        for delay in (0.0, 2.0)
        for output in ("local", "remote")
        for variant in ("hybrid", "target-only-sampled")
    ]
    assert all(r["tokens"] > 0 and r["decodes"] > 0 and r["round_trips"] >= r["decodes"] for r in runs)
    row_of_logits = 49152 * 4  # the demo target's vocabulary in floats
    assert all((r["received"] / r["decodes"] >= row_of_logits) == (r["output"] == "remote") for r in runs)
    assert "| 2 ms, output local | chat | target-only-sampled |" in table and "measured / predicted" in table
    assert (tmp_path / "rpc.png").read_bytes().startswith(b"\x89PNG")  # the curve over the delay


def test_a_chat_keeps_what_was_written_when_a_server_dies_and_goes_on_when_it_is_back(tmp_path) -> None:
    """What the UI and the terminal chat run (app/conversation.py): the cut reply stays in the conversation with
    the server's name as its error, a message sent while the server is down is kept with the reason, and the
    chat goes on once the server answers again."""
    from localspec.app.conversation import Conversation
    from localspec.core.events import TokenEvent as Token

    require(TARGET, DRAFT)
    port = _free_port()
    with rpc_server(tmp_path) as (steady, _), ExitStack() as stack:
        lost, proc = stack.enter_context(rpc_server(tmp_path, port))
        greedy = {"sampling.temperature": 0.0, "sampling.seed": 7, "sampling.max_tokens": 120}  # the same long reply
        engine = make_engine(TARGET, DRAFT, **{"model.rpc_servers": [steady, lost], **greedy})
        try:
            chat = Conversation()
            seen = 0
            for event in chat.reply(engine, engine.config, "Count from one to fifty in words."):
                seen += isinstance(event, Token)
                if seen == 1 and proc.poll() is None:  # at the first step: every later step needs the server
                    proc.send_signal(signal.SIGKILL)
                    proc.wait()
            cut = chat.turns[-1]
            assert lost in cut.trace.error and cut.reply and not cut.replied  # the partial reply is kept

            list(chat.reply(engine, engine.config, "Are you there?"))
            down = chat.turns[-1]
            assert down.user == "Are you there?" and lost in down.trace.error and "does not answer" in down.trace.error

            stack.close()
            with rpc_server(tmp_path, port):
                list(chat.reply(engine, engine.config, "And now?"))
                assert not chat.turns[-1].trace.error and chat.turns[-1].reply
                assert [turn.user for turn in chat.turns] == [
                    "Count from one to fifty in words.",
                    "Are you there?",
                    "And now?",
                ]
                engine.close()  # before the server stops
        finally:
            engine.close()
