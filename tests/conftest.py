"""Shared fixtures: the demo and real pairs (built by `localspec models prepare`, never downloaded by a test)."""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from localspec.app.catalog import user_models_dir

ROOT = Path(__file__).resolve().parent.parent
MODELS = user_models_dir()
TARGET = MODELS / "SmolLM2-135M-Instruct.F32.gguf"
DRAFT = MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"
WEAK_DRAFT = MODELS / "SmolLM2-135M-Instruct.Q4_0.gguf"
GEMMA = MODELS / "gemma-3-270m-q4_k_m.gguf"
QWEN_TARGET = MODELS / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
QWEN_DRAFT = MODELS / "qwen2.5-coder-0.5b-instruct-q4_0-pure.gguf"  # the pair's draft, derived from the Q4_K_M
REAL_PAIR = "qwen2.5-coder-1.5b"
# llama.cpp threads per model: the cores shared among the xdist workers. Two workers each decoding
# with two OpenMP threads on two cores spin on each other's barriers (measured: a real-pair test went
# from under a minute to over ten), so each worker gets its share.
TEST_THREADS = max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))


def require(*paths: Path) -> None:
    """Fail (not skip) when a model is missing: `make test` prepares them."""
    missing = [p.name for p in paths if not p.exists()]
    if missing:
        pytest.fail(f"missing {', '.join(missing)}; run `localspec models prepare --with-test-models`")


@pytest.fixture(scope="session")
def demo_paths() -> tuple[Path, Path, Path]:
    require(TARGET, DRAFT, WEAK_DRAFT)
    return TARGET, DRAFT, WEAK_DRAFT


@pytest.fixture(scope="session")
def real_paths() -> tuple[Path, Path]:
    require(QWEN_TARGET, QWEN_DRAFT)
    return QWEN_TARGET, QWEN_DRAFT


@pytest.fixture(scope="session")
def test_config(tmp_path_factory) -> Path:
    """The config every CLI test runs with: the demo pair (real-pair tests pass --pair), the worker's
    threads, and a fixed K — adaptive K follows measured timings, so a busy test machine could stop
    drafting (or pick other K) and make a seeded reply differ from run to run."""
    path = tmp_path_factory.getbasetemp() / "test-config.yaml"
    path.write_text(
        f"model:\n  pair: demo\n  threads: {TEST_THREADS}\nspeculative:\n  adaptive: false\n  remember: false\n"
    )
    return path


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory, test_config):
    """Doctor results and other caches go to a per-session folder, never the user's; the CLI runs the test config.

    Session-scoped so it is in place before any module fixture starts a CLI: as a per-test fixture it
    came after them, and a module's `localspec bench` ran the user's config (all cores) beside the other
    worker's decode; on two cores the two pairs of OpenMP threads spun on each other's barriers and the
    bench went from 8 s to past its 600 s timeout in CI."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LOCALSPEC_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
        patch.setenv("LOCALSPEC_CONFIG", str(test_config))
        yield


def make_engine(target, draft, **overrides):
    """An engine on ``target`` + ``draft`` (a path, 'ngram' or 'none'), 1,024-token context and fixed K
    unless overridden (a request can still ask for adaptive K)."""
    from localspec.app.config import Config
    from localspec.app.engine import Engine

    config = Config().with_overrides({"model.target": str(target), "model.draft": str(draft), "model.n_ctx": 1024,
                                      "model.threads": TEST_THREADS, "speculative.adaptive": False,
                                      "speculative.remember": False, **overrides})  # fmt: skip
    return Engine(config)


def generate(engine, prompt_tokens, params, **options):
    """One request through the engine: (the result, its step events)."""
    from localspec.core.events import StepEvent

    events = list(engine.stream(prompt_tokens, engine.options(**options), params))
    return events[-1], [e for e in events if isinstance(e, StepEvent)]


def run_cli(
    *args: str, input: str | None = None, timeout: float = 300, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run the real `localspec` program."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "localspec", *args],
        cwd=ROOT,
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def running_server(args: list[str], ready_prefix: str, log_path: Path, env: dict[str, str], prefix: tuple = ()):
    """`localspec ARGS` in a subprocess (run through ``prefix``, say ``ip netns exec NAME``); yields (its ready
    line, process, log) once it printed a line starting with ``ready_prefix`` — which it does once it
    answers: the wait is for that line (or for the process to exit), never for a clock."""
    import threading

    writer = log_path.open("a")
    proc = subprocess.Popen([*prefix, sys.executable, "-m", "localspec", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)  # fmt: skip
    ready_or_gone, found = threading.Event(), []

    def copy_output() -> None:  # the server's output goes to the log; its ready line means "ready"
        for line in proc.stdout:
            writer.write(line)
            writer.flush()
            if line.startswith(ready_prefix) and not found:
                found.append(line.strip())
                ready_or_gone.set()
        ready_or_gone.set()  # end of output: the process exited

    copier = threading.Thread(target=copy_output, daemon=True)
    copier.start()
    try:
        ready_or_gone.wait()
        if not found:
            proc.wait()
            copier.join()
            pytest.fail(f"`localspec {args[0]}` exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        with log_path.open() as log:  # the tests' own handle: reading never moves the writer
            yield found[0], proc, log
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        copier.join()
        writer.close()


def server_env() -> dict[str, str]:
    """A server subprocess's environment: the session's (test config and cache, set by ``_isolated_cache``),
    unbuffered."""
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


@pytest.fixture(scope="session")
def ui_server(demo_paths, tmp_path_factory):
    """`localspec ui` in a subprocess on a free port (demo pair, short replies); yields (url, process, log)."""
    target, draft, _ = demo_paths
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["ui", "--port", str(port), "--ctx", "4096", "--max-tokens", "24", "--threads", str(TEST_THREADS),
            "--target", str(target), "--draft", str(draft)]  # fmt: skip
    log_path = tmp_path_factory.mktemp("ui") / "server.log"
    with running_server(args, f"localspec UI: {url}", log_path, server_env()) as (_, proc, log):
        yield url, proc, log
