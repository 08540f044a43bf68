"""Shared fixtures: the demo pair (built by `localspec models prepare`, never downloaded by a test)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "models"
TARGET = MODELS / "SmolLM2-135M-Instruct.F32.gguf"
DRAFT = MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"
WEAK_DRAFT = MODELS / "SmolLM2-135M-Instruct.Q4_0.gguf"
GEMMA = MODELS / "gemma-3-270m-q4_k_m.gguf"


def require(*paths: Path) -> None:
    """Fail (not skip) when a model is missing: `make test` prepares them."""
    missing = [p.name for p in paths if not p.exists()]
    if missing:
        pytest.fail(f"missing {', '.join(missing)}; run `localspec models prepare --with-test-models`")


@pytest.fixture(scope="session")
def demo_paths() -> tuple[Path, Path, Path]:
    require(TARGET, DRAFT, WEAK_DRAFT)
    return TARGET, DRAFT, WEAK_DRAFT


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Doctor results and other caches go to a per-session folder, never the user's."""
    monkeypatch.setenv("LOCALSPEC_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


def run_cli(*args: str, input: str | None = None, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
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


@pytest.fixture(scope="session")
def ui_server(demo_paths, tmp_path_factory):
    """`localspec ui` in a subprocess on a free port (demo pair, short replies); yields (url, process)."""
    import time
    import urllib.request

    target, draft, _ = demo_paths
    port = _free_port()
    log = (tmp_path_factory.mktemp("ui") / "server.log").open("w+")
    env = {**os.environ, "LOCALSPEC_CACHE": str(tmp_path_factory.getbasetemp() / "cache")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "localspec", "ui", "--port", str(port), "--ctx", "1024", "--max-tokens", "24",
         "--target", str(target), "--draft", str(draft)],  # fmt: skip
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True, env=env,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    try:
        while True:
            if proc.poll() is not None:
                log.seek(0)
                pytest.fail(f"`localspec ui` exited with {proc.returncode}:\n{log.read()[-3000:]}")
            try:
                urllib.request.urlopen(url + "/config", timeout=2).read()
                break
            except OSError:
                if time.time() > deadline:
                    pytest.fail("`localspec ui` did not answer within 180 s")
                time.sleep(0.5)
        yield url, proc, log
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
