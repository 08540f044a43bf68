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


def test_the_gpu_check_refuses_a_pack_made_from_other_patches(tmp_path) -> None:
    """`gpu/check.sh build` (and `pack`, which a session runs before its visit) compares the key `make gpu-pack`
    wrote into .gpu/ with the tree's patches and candidates: a pack of other patches would spend the visit's
    build on them. In a copy of gpu/ and patches/: no pack, then the tree's key (accepted), then a candidate
    changed after packing (refused again)."""
    import os
    import shutil

    root = tmp_path / "tree"
    for folder in ("gpu", "patches"):
        shutil.copytree(ROOT / folder, root / folder)
    env = {**os.environ, "LOCALSPEC_GPU_WORK": str(tmp_path / "work")}

    def check() -> tuple[int, str]:
        done = subprocess.run(["bash", str(root / "gpu" / "check.sh"), "pack"], capture_output=True, text=True,
                              env=env, timeout=60)  # fmt: skip
        return done.returncode, done.stdout + done.stderr

    code, said = check()
    assert code == 1 and "was made from other patches (key none" in said and "make gpu-pack" in said, said
    (root / ".gpu").mkdir()
    key = subprocess.run(["bash", str(root / "gpu" / "patches_key.sh")], capture_output=True, text=True, check=True)
    (root / ".gpu" / "patches.key").write_text(key.stdout)
    code, said = check()
    assert code == 0 and "holds the tree's patches and candidates" in said, said
    candidate = next((root / "gpu" / "candidates").glob("*.patch"))
    candidate.write_text(candidate.read_text() + "\n")
    code, said = check()
    assert code == 1 and "was made from other patches" in said, said
