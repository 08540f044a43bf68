"""The llama-server side of the bench, against a stand-in server script (the real one takes ten minutes to build).

The stand-in answers /health and /completion like llama-server and reports, as
its ``predicted_n``, how many requests this process has served: that is what
tells a server that remembers earlier requests from a fresh one.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from localspec.bench.llamacpp import server_configs, start_servers
from localspec.core.errors import ConfigError, ModelError

STAND_IN = textwrap.dedent(f"""\
    #!{sys.executable}
    import json, os, sys
    from http.server import BaseHTTPRequestHandler, HTTPServer
    args = sys.argv[1:]
    if "--fail" in " ".join(args):
        sys.exit("error: bad flag")
    port = int(args[args.index("--port") + 1])
    served = 0

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _reply(self, body):
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._reply({{"status": "ok"}})

        def do_POST(self):
            global served
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if os.environ.get("STAND_IN_LOG"):  # what each request asked, for the tests to read
                with open(os.environ["STAND_IN_LOG"], "a") as log:
                    log.write(json.dumps(body) + "\\n")
            served += 1
            self._reply({{"timings": {{"predicted_n": served, "predicted_ms": 500.0,
                                       "draft_n": 4, "draft_n_accepted": 3}}}})

    HTTPServer(("127.0.0.1", port), Handler).serve_forever()
""")


@pytest.fixture
def bin_folder(tmp_path: Path) -> Path:
    script = tmp_path / "llama-server"
    script.write_text(STAND_IN)
    script.chmod(0o755)
    return tmp_path


def test_ngram_mod_starts_every_request_fresh_and_the_others_keep_running(bin_folder: Path, tmp_path: Path) -> None:
    configs = {c.name: c for c in server_configs()}
    chosen = [configs["llama.cpp"], configs["llama.cpp-ngram-mod"]]
    servers = start_servers(bin_folder, chosen, tmp_path / "t.gguf", None, 1, 512, True)
    try:
        counts = {name: [server.complete([1, 2, 3], 8, seed).n_tokens for seed in range(3)]
                  for name, server in servers.items()}  # fmt: skip
        done = servers["llama.cpp"].complete([1], 8, 0)
    finally:
        for server in servers.values():
            server.close()
    assert counts == {"llama.cpp": [1, 2, 3], "llama.cpp-ngram-mod": [1, 1, 1]}
    assert (done.decode_s, done.drafted, done.accepted) == (0.5, 4, 3)
    assert all(server.process.poll() is not None for server in servers.values())


def test_a_missing_server_binary_and_a_server_that_exits_are_named(bin_folder: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="make llama-cpp-tools"):
        start_servers(tmp_path / "nowhere", server_configs()[:1], tmp_path / "t.gguf", None, 1, 512, True)
    failing = [c for c in server_configs() if c.name == "llama.cpp"][0]
    failing = type(failing)("llama.cpp-broken", "broken", ("--fail",))
    with pytest.raises(ModelError, match="bad flag"):
        start_servers(bin_folder, [failing], tmp_path / "t.gguf", None, 1, 512, True)


def test_the_sampled_server_draws_from_the_whole_distribution_and_servers_offload_as_localspec(
    bin_folder: Path, tmp_path: Path, monkeypatch
) -> None:
    """At T > 0 llama.cpp's chain is cut to temperature alone (its default keeps the top 40, which localspec never
    does), at T = 0 the request is plain greedy; -ngl and -ngld follow localspec's n_gpu_layers (-1: all)."""
    monkeypatch.setenv("STAND_IN_LOG", str(tmp_path / "requests.jsonl"))
    configs = {c.name: c for c in server_configs()}
    assert configs["llama.cpp-sampled"].sampled and not configs["llama.cpp"].sampled
    for layers, expected in ((-1, "999"), (10, "10"), (0, "0")):
        servers = start_servers(bin_folder, [configs["llama.cpp-sampled"]], tmp_path / "t.gguf", None, 1, 512, True,
                                n_gpu_layers=layers)  # fmt: skip
        try:
            args = servers["llama.cpp-sampled"].process.args
            assert args[args.index("-ngl") + 1] == expected
            if layers == -1:
                servers["llama.cpp-sampled"].complete([1, 2], 8, 0, temperature=0.7)
                servers["llama.cpp-sampled"].complete([1, 2], 8, 0)
        finally:
            for server in servers.values():
                server.close()
    sampled, greedy = (json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines())
    assert (sampled["temperature"], sampled["samplers"]) == (0.7, ["temperature"])
    assert greedy["temperature"] == 0.0 and "samplers" not in greedy


def test_servers_turn_extra_buffers_off_only_all_together(bin_folder: Path, tmp_path: Path) -> None:
    """llama-server can turn its extra buffers off only all together: --no-repack where they cannot run."""
    chosen = server_configs()[:1]
    for extra_buffers, expected in ((True, False), (False, True)):
        servers = start_servers(bin_folder, chosen, tmp_path / "t.gguf", None, 1, 512, True, extra_buffers)
        try:
            assert ("--no-repack" in servers["llama.cpp"].process.args) == expected
        finally:
            for server in servers.values():
                server.close()


def test_llama_cpp_runs_in_its_default_placement_wherever_that_runs(monkeypatch) -> None:
    """llama.cpp's default placement is its best on the AMX VM (target alone 14.6 tok/s against 9.9 with
    --no-repack), and it runs there with localspec's AMX patch; without the patch its AMX batches die,
    and a user who turned extra buffers off gets like for like."""
    from localspec.llama import placement

    monkeypatch.delenv("LOCALSPEC_EXTRA_BUFFERS", raising=False)
    monkeypatch.setattr(placement, "system_info", lambda: "CPU : AVX2 = 1 | REPACK = 1")
    monkeypatch.setattr(placement, "amx_rows_without_tiles", lambda: False)
    assert placement.llama_cpp_default_runs()  # no AMX: nothing dies
    monkeypatch.setattr(placement, "system_info", lambda: "CPU : AVX2 = 1 | AMX_INT8 = 1 | REPACK = 1")
    assert not placement.llama_cpp_default_runs()  # AMX tiles, no patch
    monkeypatch.setattr(placement, "amx_rows_without_tiles", lambda: True)
    assert placement.llama_cpp_default_runs()  # AMX batches row by row
    monkeypatch.setenv("LOCALSPEC_EXTRA_BUFFERS", "0")
    assert not placement.llama_cpp_default_runs()
    monkeypatch.setenv("LOCALSPEC_EXTRA_BUFFERS", "1")
    monkeypatch.setattr(placement, "amx_rows_without_tiles", lambda: False)
    assert placement.llama_cpp_default_runs()  # the user says tiles work here
