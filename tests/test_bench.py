"""`localspec bench` end to end: the real command on the demo pair, tiny, checking its contract (not its timings)."""

from __future__ import annotations

import json

import pytest

from .conftest import TEST_THREADS, run_cli

pytestmark = [pytest.mark.models, pytest.mark.xdist_group("bench")]  # one worker runs the module fixture once

SPLIT_KEYS = {"draft", "verify", "other"}


@pytest.fixture(scope="module")
def report(demo_paths, tmp_path_factory):
    target, draft, _ = demo_paths
    plot = tmp_path_factory.mktemp("bench") / "speed.png"
    proc = run_cli(
        "bench", "--target", str(target), "--draft", str(draft), "--ctx", "1024",
        "--max-tokens", "6", "--repeats", "1", "--prompts", "summarise,code",
        "--variants", "greedy,prompt-lookup,adaptive", "--max-k", "5", "--reference",
        "--plot", str(plot), "--json",
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), plot, proc.stderr


def test_json_reports_every_variant_with_medians_and_ranges(report) -> None:
    data, _, _ = report
    names = [v["name"] for v in data["variants"]]
    # the target-only baselines are always added (T = 0, and T = 0.7 for adaptive's sampling); the
    # reference rows come with --reference
    assert names == ["target-only", "target-only-sampled", "greedy", "prompt-lookup", "adaptive",
                     "llama-cpp-python", "llama-cpp-python-lookup"]  # fmt: skip
    for row in data["variants"]:
        assert row["runs"] == 2  # 2 prompts x 1 repeat
        tps = row["tokens_per_second"]
        assert 0 < tps["min"] <= tps["median"] <= tps["max"]
    by_name = {v["name"]: v for v in data["variants"]}
    assert by_name["target-only"]["speedup"]["median"] == pytest.approx(1.0)
    assert by_name["adaptive"]["adaptive"] is True and by_name["adaptive"]["k"] == 5
    # the default minimum is 0: adaptive K may stop drafting (it does where drafting does not pay)
    assert data["settings"]["adaptive_range"] == [0, 5] and 0 <= by_name["adaptive"]["mean_k"]["median"] <= 5


def test_header_names_the_cpu_and_where_both_models_weights_sit(report) -> None:
    """The same bench differs by 1.5-2x between CPUs and placements, so every report says which it ran on."""
    from localspec.bench.e2e import render_table

    data, _, _ = report
    machine = data["machine"]
    assert machine["cpu"] and machine["cores"] >= 1 and machine["weight_buffers"] and machine["draft_weight_buffers"]
    header = render_table(data).splitlines()[0]
    assert header.startswith(f"CPU: {machine['cpu']}") and "; draft weights in " in header
    assert header.endswith(", one row per decode") == (machine["draft_rows_per_decode"] == 1)


def test_bench_runs_the_test_config_threads(report) -> None:
    """The module fixture's CLI gets the session's config: with the user's (all cores) beside the other
    xdist worker, two pairs of OpenMP threads spun on two cores and the bench timed out in CI."""
    data, _, _ = report
    assert data["pair"]["threads"] == TEST_THREADS


def test_speculative_rows_have_acceptance_split_and_prediction(report) -> None:
    data, _, _ = report
    for row in data["variants"]:
        if row["drafter"] == "reference":
            assert row["time_split"] is None
            continue
        split = row["time_split"]
        assert set(split) == SPLIT_KEYS and sum(split.values()) == pytest.approx(1.0, abs=1e-6)
        assert row["predicted_speedup"]["median"] > 0
        assert row["measured_over_predicted"]["median"] > 0
        if row["drafter"] == "model" and not row["adaptive"]:  # (adaptive K may draft nothing where it does not pay)
            assert 0 <= row["acceptance_rate"]["median"] <= 1
            assert row["tokens_per_step"]["median"] >= 1
            assert split["draft"] > 0  # the draft model did run
    assert data["variants"][0]["time_split"]["draft"] == 0.0  # target-only drafts nothing


def test_runs_are_interleaved_and_speedups_use_the_same_prompt_and_repeat(report) -> None:
    data, _, _ = report
    runs = data["runs"]
    order = [(r["prompt"], r["variant"]) for r in runs]
    variants = [v["name"] for v in data["variants"]]
    assert order == [(p, v) for p in ("code", "summarise") for v in variants]
    sampling = {"target-only-sampled", "adaptive"}  # T = 0.7: compared with the target sampling at 0.7
    base = {(r["prompt"], r["variant"] in sampling): r for r in runs if r["variant"].startswith("target-only")}
    for run in runs:
        if run["variant"] == "llama-cpp-python-lookup":
            assert run["reference_speedup"] is not None
        expected = run["tokens_per_second"] / base[run["prompt"], run["variant"] in sampling]["tokens_per_second"]
        assert run["speedup"] == pytest.approx(expected)


def test_plot_is_a_png_and_its_path_is_printed(report) -> None:
    data, plot, stderr = report
    assert plot.exists() and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot.stat().st_size > 10_000
    assert data["plot"] == str(plot.resolve())
    assert f"plot: {plot.resolve()}" in stderr


def test_unknown_variant_is_one_line_error_naming_it() -> None:
    proc = run_cli("bench", "--variants", "greedy,warp-speed", "--max-tokens", "4")
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == [
        "error: unknown bench variant 'warp-speed'; choose from target-only, target-only-sampled, greedy, rejection, "
        "invariant, token-match, prompt-lookup, adaptive, hybrid, hybrid-greedy"
    ]


def test_kernels_bench_compares_placements_and_checks_invariance(real_paths) -> None:
    """The real pair's target: its default placement (repacked, or the AMX buffer) next to plain memory, one run."""
    import subprocess
    import sys

    from .conftest import ROOT

    proc = subprocess.run([sys.executable, "-m", "localspec.bench", "kernels", "--pair", "qwen2.5-coder-1.5b",
                           "--model", "target", "--repeats", "2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| default") or line.startswith("| plain")]
    assert len(rows) == 2, proc.stdout
    default, plain = rows
    assert ("CPU_REPACK" in default or "AMX" in default) and "CPU_REPACK" not in plain and "AMX" not in plain
    assert default.endswith("| yes |") and plain.endswith("| yes |")  # both placements batch-invariant
    assert default.count("(1.00×)") == 3


def bench_module(name: str, *args: str, tmp_path) -> tuple[list[dict], str]:
    """``python -m localspec.bench NAME ARGS`` on the demo pair with the worker's threads: its runs and table."""
    import subprocess
    import sys

    from .conftest import ROOT

    runs = tmp_path / f"{name}.json"
    proc = subprocess.run([sys.executable, "-m", "localspec.bench", name, *args, "--pair", "demo", "--threads",
                           str(TEST_THREADS), "--json", str(runs)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(runs.read_text()), proc.stdout


def test_the_cold_start_bench_times_a_fresh_process_per_reply(tmp_path) -> None:
    """Issue 39: the cold-start bench runs each variant in its own `localspec generate`, interleaved, and
    reports each against the target alone. Its "default" resumes what its earlier runs learnt: the
    learnt state is in the folder it keeps, and the runs without it start from nothing."""
    runs, table = bench_module("cold", "--prompts", "chat", "--max-tokens", "8", "--repeats", "2", "--adaptive",
                               tmp_path=tmp_path)  # fmt: skip
    assert [(r["variant"], r["repeat"]) for r in runs] == [
        (variant, repeat) for repeat in (1, 2) for variant in ("target alone", "default", "nothing learnt")
    ]
    assert all(0 < r["tokens"] <= 8 and r["tokens_per_second"] > 0 and r["process_s"] > 0 for r in runs)
    row = next(line for line in table.splitlines() if line.startswith("| chat |"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert float(cells[3]) == pytest.approx(float(cells[2]) / float(cells[1]), abs=0.01)


def test_the_front_ends_bench_drives_the_terminal_chat_and_the_api(tmp_path) -> None:
    """Issue 39: one prompt through `localspec generate`, a real terminal chat and the API, interleaved;
    every front end's engine rate is read from what that front end reports."""
    runs, table = bench_module("frontends", "--max-tokens", "8", "--repeats", "1", tmp_path=tmp_path)
    assert [(r["front_end"], r["variant"]) for r in runs] == [
        (end, variant) for variant in ("target-only", "rejection") for end in ("generate", "chat", "api")
    ]
    assert all(0 < r["tokens"] <= 8 and r["tokens_per_second"] > 0 for r in runs)
    assert "| target-only |" in table and "| rejection |" in table


def test_the_sampler_bench_times_llama_cpps_own_chain_on_the_same_row(demo_paths) -> None:
    """`python -m localspec.bench sampler --against-llama-cpp`: localspec's target-only draw and llama.cpp's
    sampler chain on real output rows (three of a greedy reply), both temperatures; llama.cpp's greedy chain
    and localspec's argmax agree on a row (the same row is what both read)."""
    import numpy as np

    from localspec.app.engine import llama_cpp_sampler
    from localspec.bench.sampler import against_llama_cpp, against_llama_cpp_table
    from localspec.core.sampling import SamplingParams, greedy_token
    from localspec.llama.model import LlamaModel

    found = against_llama_cpp(str(demo_paths[0]), repeats=2, n_rows=3)
    assert set(found) == {(t, who) for t in ("T = 0", "T = 0.7") for who in ("localspec", "llama.cpp")}
    assert all(len(per_row) == 3 and min(per_row) > 0 for per_row in found.values())
    assert against_llama_cpp_table(found, "demo").count("\n| T = ") == 2
    from localspec.bench.sampler import real_rows, verify_table, verify_with_and_without_bounds

    rows = real_rows(str(demo_paths[0]), 9)
    assert rows.shape[0] == 9 and rows.dtype == np.float32
    found = {(draft, 4): verify_with_and_without_bounds(rows, 4, draft, seeds=1) for draft in ("lookup", "model")}
    assert all(min(cell["with every total"] + cell["with bounds"]) > 0 for cell in found.values())
    assert verify_table(found, "demo").count("\n| lookup | 4 |") == 1
    one_row = against_llama_cpp(str(demo_paths[0]), repeats=2, temperatures=(1.5,))
    assert set(one_row) == {("T = 1.5", "localspec"), ("T = 1.5", "llama.cpp")}
    assert against_llama_cpp_table(one_row, "demo").count("\n| T = 1.5 |") == 1
    model = LlamaModel(demo_paths[0], role="target")
    greedy = llama_cpp_sampler(0.0)
    try:
        for text in ("def quicksort(items):", "The capital of France is"):
            model.truncate(0)
            row = model.extend(model.tokenize(text), 1)[0]
            assert greedy.sample(model) == greedy_token(row, SamplingParams(temperature=0.0)) == int(np.argmax(row))
    finally:
        greedy.close()
        model.close()
