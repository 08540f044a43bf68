"""The GPU check's probes of `serve` and `ui` (gpu/check.sh runs them on a lent GPU) work here, on the demo
pair and the CPU, so a GPU visit never spends its minutes on a probe that broke with the front end."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .conftest import ROOT, TEST_THREADS, server_env

pytestmark = pytest.mark.models


@pytest.mark.parametrize("probe", ["serve_probe.py", "ui_probe.py"])
def test_the_gpu_check_probe_gets_a_reply(probe, demo_paths) -> None:
    target, draft, _ = demo_paths
    command = [sys.executable, str(ROOT / "gpu" / probe), str(target), str(draft), "--threads", str(TEST_THREADS),
               "--ctx", "2048"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=server_env(), cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("ok: ") and " in " in last, last
