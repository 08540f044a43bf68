"""`localspec generate`, `doctor` and `models` as a user runs them: real program, real models."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from localspec.app.trace import Trace

from .conftest import DRAFT, GEMMA, ROOT, TARGET, WEAK_DRAFT, require, run_cli

pytestmark = pytest.mark.models


def one_error_line(result) -> str:
    """Bad input: non-zero exit, no traceback, exactly one line on stderr starting with 'error:'."""
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr + result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.fixture(scope="module", autouse=True)
def _models_present():
    require(TARGET, DRAFT, WEAK_DRAFT, GEMMA)


def test_json_output_contract() -> None:
    result = run_cli("generate", "Say hello.", "--max-tokens", "24", "--seed", "7", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert set(out) >= {"text", "token_ids", "statuses", "stop_reason", "stats"}
    assert len(out["token_ids"]) == len(out["statuses"]) > 0
    assert set(out["statuses"]) <= {"accepted", "corrected", "bonus", "target"}
    assert out["stop_reason"] in ("eos", "max_tokens")
    stats = out["stats"]
    for key in ("drafted", "accepted", "acceptance_rate", "steps", "tokens_per_step", "tokens_per_second",
                "draft_s", "verify_s", "other_s"):  # fmt: skip
        assert key in stats, key
    assert stats["drafted"] > 0 and 0 <= stats["acceptance_rate"] <= 1


def test_plain_output_streams_the_text_and_json_agrees() -> None:
    args = ("generate", "Name a colour.", "--max-tokens", "16", "--seed", "3", "--temperature", "0")
    plain = run_cli(*args)
    as_json = json.loads(run_cli(*args, "--json").stdout)
    assert plain.returncode == 0
    assert plain.stdout == as_json["text"] + "\n"


def test_stdin_prompt_and_raw_mode() -> None:
    result = run_cli(
        "generate", "-", "--raw", "--max-tokens", "8", "--temperature", "0", "--json", input="The capital of France is"
    )
    assert result.returncode == 0, result.stderr
    assert "Paris" in json.loads(result.stdout)["text"]


def test_greedy_cli_matches_target_only_cli() -> None:
    base = ("generate", "Write a haiku about rain.", "--max-tokens", "48", "--temperature", "0", "--json")
    speculative = json.loads(run_cli(*base, "--mode", "greedy").stdout)
    target_only = json.loads(run_cli(*base, "--draft", "none").stdout)
    assert speculative["token_ids"] == target_only["token_ids"]
    assert set(target_only["statuses"]) == {"target"}


def test_invariant_cli_is_identical_with_either_draft_or_none() -> None:
    base = ("generate", "Tell me about the moon.", "--max-tokens", "40", "--temperature", "0.8", "--seed", "11",
            "--mode", "invariant", "--json")  # fmt: skip
    ids = [json.loads(run_cli(*base, "--draft", str(d)).stdout)["token_ids"] for d in (DRAFT, WEAK_DRAFT, "none")]
    assert ids[0] == ids[1] == ids[2]


def test_trace_file_is_written_and_readable(tmp_path) -> None:
    path = tmp_path / "t.jsonl"
    result = run_cli("generate", "Count to five.", "--max-tokens", "20", "--seed", "1", "--trace", str(path))
    assert result.returncode == 0, result.stderr
    trace = Trace.load(path)
    assert trace.header["target"] == TARGET.name and trace.header["prompt_tokens"]
    assert trace.steps and trace.tokens and trace.result
    assert len(trace.tokens) == len(trace.result["token_ids"])
    reached = [row for step in trace.steps for row in step["rows"] if row["outcome"] != "not-reached"]
    assert reached and all(len(row["top_p"]) == 10 for row in reached)


# ---------------------------------------------------------------------------
# bad input: one clear line, non-zero exit
# ---------------------------------------------------------------------------
def test_missing_model_file() -> None:
    line = one_error_line(run_cli("generate", "hi", "--target", "models/does-not-exist.gguf"))
    assert "does-not-exist.gguf does not exist" in line and "models prepare" in line


def test_file_that_is_not_gguf(tmp_path) -> None:
    fake = tmp_path / "notes.gguf"
    fake.write_text("this is not a model\n" * 100)
    line = one_error_line(run_cli("generate", "hi", "--draft", str(fake)))
    assert "is not a GGUF file" in line and "notes.gguf" in line


def test_truncated_gguf(tmp_path) -> None:
    broken = tmp_path / "truncated.gguf"
    with DRAFT.open("rb") as src, broken.open("wb") as dst:
        dst.write(src.read(20_000_000))
    line = one_error_line(run_cli("generate", "hi", "--draft", str(broken)))
    assert "truncated.gguf could not be loaded" in line and "truncated or corrupt" in line


def test_a_model_too_large_for_memory_is_not_called_corrupt() -> None:
    """Memory llama.cpp could not allocate is no corrupt file: the message names the buffer, its size and the
    fix. A real load of the demo target (513 MiB of F32, read into memory: use_mmap false) in a process whose
    address space allows 300 MiB more than it has: llama.cpp's own allocation fails. Control: the same load
    without the limit succeeds, so the limit is what failed it."""
    import subprocess
    import sys

    script = f"""
import re, resource, sys
from localspec.llama import runtime
from localspec.llama.model import LlamaModel, LlamaSettings
runtime.start()
if sys.argv[1] == "limited":
    size = int(re.search(r"VmSize:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (size + 300 * 2**20, resource.RLIM_INFINITY))
try:
    LlamaModel({str(TARGET)!r}, LlamaSettings(use_mmap=False, n_ctx=256), role="target").close()
    print("loaded")
except Exception as error:
    print(f"{{type(error).__name__}}: {{error}}")
"""
    said = {
        limit: subprocess.run(
            [sys.executable, "-c", script, limit], capture_output=True, text=True, timeout=300, cwd=ROOT
        ).stdout.strip()  # fmt: skip
        for limit in ("limited", "free")
    }
    assert said["free"] == "loaded", said
    expected = "target model SmolLM2-135M-Instruct.F32.gguf does not fit in memory: llama.cpp could not allocate"
    assert said["limited"].startswith(f"OutOfMemoryError: {expected} its CPU buffer of 513 MiB"), said
    assert "model.use_mmap: true" in said["limited"] and "corrupt" not in said["limited"]


def test_incompatible_pair_names_the_first_differing_token() -> None:
    line = one_error_line(run_cli("generate", "hi", "--draft", str(GEMMA)))
    assert "token 0 is '<|endoftext|>' in the target but '<pad>' in the draft" in line


def test_prompt_longer_than_context() -> None:
    line = one_error_line(run_cli("generate", "word " * 400, "--ctx", "256"))
    assert "context holds 256" in line and "shorten it or raise model.n_ctx" in line


def test_unknown_flag() -> None:
    line = one_error_line(run_cli("generate", "hi", "--temprature", "0.5"))
    assert "--temprature" in line


def test_unknown_config_key_and_bad_value(tmp_path) -> None:
    bad_key = tmp_path / "bad.yaml"
    bad_key.write_text("sampling:\n  temprature: 0.5\n")
    line = one_error_line(run_cli("--config", str(bad_key), "generate", "hi"))
    assert "sampling.temprature" in line and "did you mean 'sampling.temperature'" in line
    retired = tmp_path / "old.yaml"  # a setting an older version had: say so and how to mend the file
    retired.write_text("speculative:\n  ngram_max: 3\n")
    line = one_error_line(run_cli("--config", str(retired), "generate", "hi"))
    assert "unknown setting 'speculative.ngram_max' (retired:" in line and "delete the line" in line
    bad_value = tmp_path / "bad2.yaml"
    bad_value.write_text("model:\n  n_ctx: 10\n")
    line = one_error_line(run_cli("--config", str(bad_value), "generate", "hi"))
    assert "model.n_ctx = 10 is out of range" in line


def test_draft_tokens_out_of_range() -> None:
    line = one_error_line(run_cli("generate", "hi", "--draft-tokens", "99"))
    assert "--draft-tokens 99 is out of range; allowed: from 0 to 16" in line


def test_bad_temperature() -> None:
    line = one_error_line(run_cli("generate", "hi", "--temperature", "-1"))
    assert "--temperature -1.0 is out of range" in line


# ---------------------------------------------------------------------------
# doctor and the invariance warning
# ---------------------------------------------------------------------------
def cpu_build_precondition() -> None:
    """The doctor tests pin CPU facts (the backend line, flash attention's effect past position 256)."""
    from localspec.llama.runtime import gpu_offload_supported

    assert not gpu_offload_supported(), (
        "precondition: a CPU-only build of llama-cpp-python (these tests measure CPU kernels)"
    )


def test_doctor_reports_build_backend_memory_and_invariance() -> None:
    cpu_build_precondition()
    result = run_cli("doctor")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "llamafile sgemm off" in out
    assert "backend: CPU" in out and "threads:" in out and "memory:" in out and "GiB free" in out
    assert "batch invariance (target)" in out and "bit-identical" in out
    assert "compatible" in out


def test_doctor_finds_flash_attention_non_invariant(tmp_path) -> None:
    cpu_build_precondition()
    config = tmp_path / "fa.yaml"
    config.write_text(f"model:\n  target: {TARGET}\n  draft: none\n  flash_attention: true\n")
    result = run_cli("--config", str(config), "doctor")
    assert result.returncode == 0
    assert "DIFFER" in result.stdout
    assert re.search(r"verify batch of \d+ at position \d{3}: max diff", result.stdout)  # past position 256
    assert "cause: flash attention" in result.stdout and "fix: set model.flash_attention: false" in result.stdout


def test_greedy_on_a_non_invariant_target_reloads_it_and_says_so(tmp_path) -> None:
    """Never silently: flash attention on CPU changes batched logits past position 256 (the doctor test
    above), so greedy mode reloads the target with it off, prints one note naming cause and fix, and
    then matches target-only output with flash attention off."""
    config = tmp_path / "fa.yaml"
    config.write_text(f"model:\n  target: {TARGET}\n  draft: {DRAFT}\n  flash_attention: true\n")
    args = ("--config", str(config), "generate", "The sky is", "--raw", "--max-tokens", "24", "--json")
    result = run_cli(*args, "--mode", "greedy")
    assert result.returncode == 0, result.stderr
    notes = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(notes) == 1 and notes[0].startswith("note:"), result.stderr
    assert "flash attention" in notes[0] and "model.flash_attention: false" in notes[0]
    plain = run_cli("generate", "The sky is", "--raw", "--max-tokens", "24", "--json", "--temperature", "0",
                    "--target", str(TARGET), "--draft", "none")  # fmt: skip
    assert json.loads(result.stdout)["token_ids"] == json.loads(plain.stdout)["token_ids"]
    quiet = run_cli(*args, "--temperature", "0.7", "--seed", "1")  # rejection sampling does not need invariance
    assert quiet.returncode == 0 and quiet.stderr.strip() == ""
    invariant = run_cli("generate", "The sky is", "--raw", "--max-tokens", "8", "--mode", "greedy")
    assert invariant.returncode == 0 and invariant.stderr.strip() == ""  # the default build and settings


# ---------------------------------------------------------------------------
# model preparation
# ---------------------------------------------------------------------------
def test_models_prepare_is_a_no_op_and_rebuilds_a_corrupted_file(tmp_path) -> None:
    from localspec.app.catalog import Catalog, Preparer

    catalog = Catalog.load()
    catalog.models_dir = tmp_path
    shutil.copy(DRAFT, tmp_path / DRAFT.name)  # the PyPI original; the F32 target is derived from it
    said: list[str] = []
    preparer = Preparer(catalog, say=said.append)
    preparer.prepare_pair("demo")  # derives F32 from the local Q4_1; no download needed
    assert preparer.actions == [f"built {TARGET.name}"]
    target = tmp_path / TARGET.name
    again = Preparer(catalog, say=said.append)
    again.prepare_pair("demo")
    assert again.actions == []
    with target.open("r+b") as handle:  # flip bytes in the middle of the file
        handle.seek(10_000_000)
        handle.write(b"\x00" * 64)
    repaired = Preparer(catalog, say=said.append)
    repaired.prepare_pair("demo")
    assert repaired.actions == [f"rebuilt {TARGET.name}"]
    assert any("checksum mismatch" in s for s in said)


def test_models_list_shows_presence_and_the_active_pair() -> None:
    result = run_cli("models", "list", env={"COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    assert "✓ SmolLM2-135M-Instruct.F32.gguf" in result.stdout
    assert "✓ qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" in result.stdout
    assert "✗ Qwen2.5-7B-Instruct-Q4_K_M.gguf" in result.stdout
    assert "active: demo" in result.stdout  # the tests' config selects the demo pair
    real = run_cli("models", "list", "--pair", "qwen2.5-coder-1.5b", env={"COLUMNS": "200"})
    assert "active: qwen2.5-coder-1.5b" in real.stdout
    default = run_cli("models", "list", env={"COLUMNS": "200", "LOCALSPEC_CONFIG": str(ROOT / "config.yaml")})
    assert "active: qwen2.5-coder-1.5b" in default.stdout  # config.yaml's default is the real pair


def test_unknown_pair_is_one_line_naming_the_pairs() -> None:
    line = one_error_line(run_cli("generate", "hi", "--pair", "qwen-typo"))
    assert "no pair named 'qwen-typo'" in line and "qwen2.5-coder-1.5b" in line and "demo" in line


# --- found by a reliability probe of the front ends ---------------------------
def test_prompt_that_is_not_utf8_is_read_with_replacement_characters() -> None:
    """Bytes that are not UTF-8, on standard input or in an argument, never end in a traceback."""
    import os
    import subprocess
    import sys

    command = [sys.executable, "-m", "localspec", "generate", "-", "--max-tokens", "4", "--json"]
    piped = subprocess.run(command, cwd=ROOT, input=b"Hello \xff there", capture_output=True, timeout=300,
                           env=os.environ.copy())  # fmt: skip
    assert piped.returncode == 0 and b"Traceback" not in piped.stderr, piped.stderr.decode(errors="replace")
    argument = run_cli("generate", "Hi \udcff", "--max-tokens", "4", "--json")  # the byte 0xff, as argv carries it
    assert argument.returncode == 0 and "Traceback" not in argument.stderr, argument.stderr
    for result in (piped.stdout.decode(), argument.stdout):
        assert json.loads(result)["token_ids"]  # it answered


def test_a_full_context_is_said_on_stderr() -> None:
    result = run_cli("generate", "1, 2, 3, 4, 5,", "--raw", "--temperature", "0", "--ctx", "64", "--max-tokens", "500")
    assert result.returncode == 0, result.stderr
    assert re.search(r"note: the context \(\d+ tokens\) is full", result.stderr), result.stderr
    assert "stop: context_full" in result.stderr


def test_an_empty_stop_string_is_refused() -> None:
    line = one_error_line(run_cli("generate", "Hi", "--stop", ""))
    assert "--stop ''" in line and "empty" in line


def test_a_draft_larger_than_its_target_is_warned_about() -> None:
    result = run_cli("generate", "Hi", "--max-tokens", "2", "--target", str(DRAFT), "--draft", str(TARGET))
    assert result.returncode == 0, result.stderr
    assert "warning: the draft" in result.stderr and "is not smaller than the target" in result.stderr
    normal = run_cli("generate", "Hi", "--max-tokens", "2", "--target", str(TARGET), "--draft", str(DRAFT))
    assert "warning" not in normal.stderr


def test_trace_into_a_missing_folder_is_refused_before_generating(tmp_path) -> None:
    line = one_error_line(run_cli("generate", "Hi", "--trace", str(tmp_path / "nope" / "t.jsonl")))
    assert "does not exist" in line and not (tmp_path / "nope").exists()
