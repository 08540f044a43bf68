"""llama.cpp's own llama-server, timed inside `localspec bench` on the same prompts, models and threads.

`make llama-cpp-tools` builds llama-server from the very llama.cpp source
(and patches, and flags) the llama-cpp-python wheel was built from, so the
comparison is like for like: one server per configuration (target alone at
T = 0 and at the bench's T > 0, draft-simple at several K, the n-gram modes)
is started with the bench's threads, context and layers offloaded, all of
them before the first timed run, and the bench
sends each of them the same prompt tokens in its interleaved order. Speed is
the server's own decode rate (``timings.predicted_per_second``), the
counterpart of localspec's tokens per decode second; the prompt is evaluated
anew each time (``cache_prompt: false``) and not counted by either.

The servers run in llama.cpp's own default weight placement (every extra
buffer type, on AMX builds the AMX buffer) wherever that runs: on AMX builds
whose tile instructions die (VMs that do not enable AMX's tile state) only
with localspec's AMX patch, whose ``GGML_AMX_NO_TILES`` the servers inherit.
Where it does not run (AMX builds without that patch), and where the user
turned extra buffers off (``LOCALSPEC_EXTRA_BUFFERS=0``), they run with
``--no-repack``: llama-server can turn extra buffers off only all together
(its ``--override-tensor`` knows no ``CPU_REPACK``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from localspec.core.errors import ConfigError, ModelError

SERVER = "llama-server"
DRAFT_SIMPLE_KS = (2, 4, 8)


@dataclass(frozen=True)
class ServerConfig:
    """One llama-server configuration: its variant name, label and speculative flags."""

    name: str
    label: str
    flags: tuple[str, ...]
    needs_draft: bool = False
    remembers: bool = False  # keeps state across requests: restarted before each one
    sampled: bool = False  # samples at the bench's T > 0 from the whole distribution, as localspec does


def server_configs(draft_ks: Sequence[int] = DRAFT_SIMPLE_KS) -> list[ServerConfig]:
    configs = [
        ServerConfig("llama.cpp", "llama-server, target only (T=0)", ()),
        ServerConfig("llama.cpp-sampled", "llama-server, target only", (), sampled=True),
    ]
    configs += [
        ServerConfig(f"llama.cpp-draft-{k}", f"llama-server draft-simple, n-max {k} (T=0)",
                     ("--spec-type", "draft-simple", "--spec-draft-n-max", str(k)), needs_draft=True)
        for k in draft_ks
    ]  # fmt: skip
    configs += [
        ServerConfig("llama.cpp-ngram-simple", "llama-server ngram-simple (T=0)", ("--spec-type", "ngram-simple")),
        ServerConfig(
            "llama.cpp-ngram-mod", "llama-server ngram-mod (T=0)", ("--spec-type", "ngram-mod"), remembers=True
        ),
    ]
    return configs


def find_server(folder: str | Path) -> Path:
    path = Path(folder).expanduser() / SERVER
    if not path.is_file() or not os.access(path, os.X_OK):
        raise ConfigError(
            f"no runnable {SERVER} in {folder}; build it with `make llama-cpp-tools` and pass its bin folder"
        )
    return path


@dataclass
class Completion:
    """What one request to a server measured."""

    n_tokens: int
    decode_s: float
    drafted: int
    accepted: int


class LlamaServer:
    """One running llama-server (127.0.0.1, a free port, one slot), stopped by :meth:`close`."""

    def __init__(self, binary: Path, config: ServerConfig, target: Path, draft: Path | None, threads: int,
                 n_ctx: int, use_mmap: bool, extra_buffers: bool = True, n_gpu_layers: int = 0) -> None:  # fmt: skip
        self.config = config
        self.served = 0
        self._start(binary, target, draft, threads, n_ctx, use_mmap, extra_buffers, n_gpu_layers)

    def _start(self, binary: Path, target: Path, draft: Path | None, threads: int, n_ctx: int, use_mmap: bool,
               extra_buffers: bool, n_gpu_layers: int) -> None:  # fmt: skip
        config = self.config
        self._args = (binary, target, draft, threads, n_ctx, use_mmap, extra_buffers, n_gpu_layers)
        self.port = _free_port()
        layers = str(999 if n_gpu_layers < 0 else n_gpu_layers)  # localspec's -1 (all) in llama.cpp's spelling
        args = [str(binary), "-m", str(target), "--host", "127.0.0.1", "--port", str(self.port), "-np", "1",
                "-t", str(threads), "-tb", str(threads), "-c", str(n_ctx), "-fa", "off", "-ngl", layers]  # fmt: skip
        if not use_mmap:
            args.append("--no-mmap")
        if not extra_buffers:
            args.append("--no-repack")  # for the draft too (see the module's docstring)
        if config.needs_draft:
            if draft is None:
                raise ConfigError(f"{config.name} needs a draft model; load a pair with a draft")
            args += ["-md", str(draft), "-td", str(threads), "-tbd", str(threads), "-ngld", layers]
        args += list(config.flags)
        env = {k: v for k, v in os.environ.items() if k != "GGML_CPU_TILED_MM"}  # llama.cpp's own defaults
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True)

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        """Block until /health answers 200 (the models are loaded), or fail with the server's last words."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = (self.process.stderr.read() or "").strip().splitlines()[-3:]
                raise ModelError(
                    f"{SERVER} ({self.config.name}) exited with {self.process.returncode}: {' / '.join(tail)}"
                )
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as reply:
                    if reply.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)  # a poll interval while a process loads, not a race: readiness is the /health answer
        raise ModelError(f"{SERVER} ({self.config.name}) was not ready within {timeout_s:.0f} s")

    def complete(self, tokens: Sequence[int], max_tokens: int, seed: int, temperature: float = 0.0) -> Completion:
        """One reply of ``max_tokens``. At ``temperature`` > 0 llama.cpp's chain is temperature alone, then its
        draw: the whole distribution localspec samples from (its default chain would cut it to the top 40)."""
        if self.config.remembers and self.served:  # forget earlier replies (see the module's docstring)
            self.close()
            self._start(*self._args)
            self.wait_ready()
        self.served += 1
        body = {"prompt": list(tokens), "n_predict": max_tokens, "temperature": temperature, "seed": seed,
                "cache_prompt": False, "stream": False}  # fmt: skip
        if temperature > 0:
            body["samplers"] = ["temperature"]
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/completion", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=600) as reply:
            data = json.load(reply)
        timings = data.get("timings", {})
        n = int(timings.get("predicted_n", data.get("tokens_predicted", 0)))
        return Completion(n, float(timings.get("predicted_ms", 0.0)) / 1000.0,
                          int(timings.get("draft_n", 0)), int(timings.get("draft_n_accepted", 0)))  # fmt: skip

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_servers(folder: str | Path, configs: Sequence[ServerConfig], target: Path, draft: Path | None,
                  threads: int, n_ctx: int, use_mmap: bool,
                  extra_buffers: bool = True, n_gpu_layers: int = 0) -> dict[str, LlamaServer]:  # fmt: skip
    """Start every configuration's server, then wait for all of them (they load in parallel). ``n_gpu_layers``:
    localspec's offload, for both models (-1 all)."""
    binary = find_server(folder)
    servers: dict[str, LlamaServer] = {}
    try:
        for config in configs:
            if config.needs_draft and draft is None:
                continue
            servers[config.name] = LlamaServer(binary, config, target, draft, threads, n_ctx, use_mmap, extra_buffers,
                                               n_gpu_layers)  # fmt: skip
        for server in servers.values():
            server.wait_ready()
    except BaseException:
        for server in servers.values():
            server.close()
        raise
    return servers


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
