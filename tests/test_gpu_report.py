"""`python -m localspec.bench gpu`: the report a lent GPU writes, checked on the CPU (its contract, not its timings)."""

from __future__ import annotations

import pytest

from localspec.bench import gpu
from localspec.core.perf import best_draft_length, expected_tokens_per_step


def test_the_best_draft_length_is_the_models_argmax_and_never_worse_than_the_target_alone() -> None:
    """GPU-like costs: a verification batch costs little more than a token."""
    verify = {rows: 0.0057 * (1 + 0.08 * (rows - 1)) for rows in range(1, 18)}
    t_target = verify[1]
    for alpha, t_draft in ((0.98, 0.0), (0.8, 0.0), (0.9, 0.00335), (0.66, 0.00335)):
        k, speedup = best_draft_length(alpha, t_draft, verify, t_target)
        by_hand = {
            j: expected_tokens_per_step(alpha, j) * t_target / (j * t_draft + verify[j + 1]) for j in range(1, 17)
        }
        best = max(by_hand, key=by_hand.get)
        if by_hand[best] > 1.0:
            assert (k, speedup) == (best, pytest.approx(by_hand[best])), (alpha, t_draft)
        else:  # drafting cannot pay: the target alone
            assert (k, speedup) == (0, 1.0), (alpha, t_draft)
    assert best_draft_length(0.66, 0.00335, verify, t_target) == (0, 1.0)  # the 0.5B draft on a 7B-like target
    k, speedup = best_draft_length(0.98, 0.0, verify, t_target)
    assert k == 16 and speedup > 4  # free, nearly always right drafts: as long as the batch allows


def _model(label: str, one_row_ms: float, per_row: float, diff: float = 0.0) -> dict:
    return {
        "label": label,
        "path": f"/m/{label}.gguf",
        "description": "qwen2 ?B Q4_K - Medium",
        "size_mib": 100.0,
        "load_s": 1.0,
        "buffers": {"CUDA0": 90.0, "CPU_Mapped": 10.0},
        "placement": "all 24 layers and the output on CUDA0",
        "ms": {rows: one_row_ms * (1 + per_row * (rows - 1)) for rows in gpu.COST_ROWS},
        "ms_steady": {rows: 0.8 * one_row_ms * (1 + per_row * (rows - 1)) for rows in gpu.STEADY_ROWS},
        "depth": 300,
        "batch_diff": {rows: (diff if rows >= 5 else 0.0) for rows in gpu.INVARIANCE_ROWS},
        "probe": f"{label}: ...",
        "probe_identical": diff == 0.0,
    }


def test_the_report_has_every_section_and_its_predictions() -> None:
    models = [
        _model("draft-0.5B", 3.35, 0.05),
        _model("target-7B", 5.73, 0.08, diff=1.5e-5),
        _model("target-32B", 17.2, 0.08, diff=2e-5),
    ]
    rows = gpu.predictions(models)
    assert [(r["target"], r["drafter"]) for r in rows] == [
        ("target-7B", "draft-0.5B"),
        ("target-7B", "lookup"),
        ("target-32B", "draft-0.5B"),
        ("target-32B", "lookup"),
    ]
    by = {(r["target"], r["drafter"]): r for r in rows}
    assert by[("target-7B", "draft-0.5B")]["best"]["chat"] == (0, 1.0)  # too costly a draft for a 7B at 0.66
    assert (
        by[("target-32B", "draft-0.5B")]["best"]["code"][1] > 1.3 and by[("target-7B", "lookup")]["best"]["edit"][0] > 8
    )
    result = {
        "device": "CUDA0 (NVIDIA H200, 143.0 GiB, 140.0 free)",
        "cpu": "Xeon",
        "hand_over_us": 31.4,
        "date": "2026-11-26",
        "command": "python -m localspec.bench gpu ...",
        "notes": ["nvidia-smi: NVIDIA H200"],
        "build": {"version": "0.3.36", "system_info": "CUDA : ARCHS = 900", "stamp": {"cmake_args": "-DGGML_CUDA=on"}},
        "models": models,
        "predictions": rows,
        "llama_bench": {"target-7B": {"tokens_per_second": 170.0}, "draft-0.5B": {"error": ["no such file"]}},
        "end_to_end": [
            {
                "pair": "7b + 0.5b",
                "table": "| variant |",
                "identity": [
                    {"prompt": "code", "k": 4, "tokens": 96, "identical": True, "first_difference": None},
                    {"prompt": "code", "k": 8, "tokens": 96, "identical": False, "first_difference": 41},
                ],
                "learned": [
                    {"mode": "rejection, T = 0.7", "switch_ms": 1.55, "verify_ms": {1: 4.65, 3: 5.9}, "draft_ms": 1.66}
                ],  # fmt: skip
                "profile": [
                    {
                        "variant": "default",
                        "prompt": "chat",
                        "steps": 90,
                        "ms_per_step": 1.234,
                        "split": {"step": 0.9, "plan": 0.05, "draft": 0.0, "verify": 0.3, "other": 0.55},
                        "functions": [("sampling.py:279 _exp_scaled", 0.301)],
                        "extra": [("costs.py:188 _memo", 0.052)],
                    },
                ],  # fmt: skip
            }
        ],
    }
    text = gpu.render(result)
    for heading in (
        "# localspec on CUDA0 (NVIDIA H200",
        "## Where the weights went",
        "## A decode of n rows",
        "## Batch invariance",
        "## Target alone against llama.cpp",
        "## Predicted speedup",
        "## End to end: 7b + 0.5b",
    ):
        assert heading in text, heading
    assert "| target-7B | = | = | = | 1.5e-05 |" in text  # rows 2-4 identical, 5 on differ
    assert "| target-7B | 300 | 170.0 | 218.2 | 1.28 |" in text and "no such file" in text  # 1000 / (0.8 * 5.73)
    assert "| target-7B | 4.58 / 5.73 | 6.05 / 7.56 | 7.52 / 9.40 |" in text  # steady against the sweep's
    assert "code, K = 4: 96 tokens, identical" in text and "code, K = 8: 96 tokens, DIFFERS from token 41" in text
    assert "nvidia-smi: NVIDIA H200" in text
    assert "- rejection, T = 0.7: a change 1.55; rows 1 4.65, 3 5.90; a drafted token 1.66" in text
    assert "a round trip to llama.cpp's compute thread (each decode pays one): 31 µs" in text
    assert "The loop's own time, default (chat, T = 0.7, 90 steps" in text and "1.234 ms a step" in text
    assert "| `sampling.py:279 _exp_scaled` | 0.301 |" in text
    assert "beyond the target alone" in text and "| `costs.py:188 _memo` | 0.052 |" in text
    assert "A reply of the default without the profiler (chat, T = 0.7): 0.900 ms a step — plan 0.050" in text


@pytest.mark.models
def test_a_models_facts_are_measured_through_localspecs_own_model(demo_paths) -> None:
    from localspec.app.config import Config
    from localspec.app.engine import llama_settings

    settings = llama_settings(Config().with_overrides({"model.n_ctx": 1024, "model.threads": 1}))
    facts = gpu.model_facts("draft-demo", str(demo_paths[1]), settings, repeats=1)
    assert facts["buffers"] and all(mib > 0 for mib in facts["buffers"].values())
    assert set(facts["ms"]) == set(gpu.COST_ROWS) and all(ms > 0 for ms in facts["ms"].values())
    assert set(facts["ms_steady"]) == set(gpu.STEADY_ROWS) and all(ms > 0 for ms in facts["ms_steady"].values())
    assert set(facts["batch_diff"]) == set(gpu.INVARIANCE_ROWS)
    assert facts["depth"] > 256  # llama-bench is run at this depth, past attention's first 256 cells
    # localspec's CPU build is batch-invariant (the suite's premise): every batch size, and the doctor's probe
    assert all(diff == 0.0 for diff in facts["batch_diff"].values()) and facts["probe_identical"]


@pytest.mark.models
def test_the_loop_profile_names_what_each_loop_spends_its_own_time_on(demo_paths) -> None:
    """One reply of the target alone and one of the default under cProfile: the default's own time includes
    its plan (lookup's search, the controller's choice), the target alone's has none of it (the control),
    and llama.cpp's time (the wait for the compute thread) is in neither."""
    from localspec.bench.e2e import load_prompts

    from .conftest import make_engine

    engine = make_engine(demo_paths[0], demo_paths[1], **{"speculative.adaptive": True})
    try:
        alone, default = gpu.loop_profile(engine, load_prompts(["chat"])[0], max_tokens=24, top=1000)
        learned = gpu._learned(engine)  # the default's controller: its costs, a change of size among them
    finally:
        engine.close()
    assert [entry["mode"] for entry in learned] == ["rejection, T = 0.7"], learned
    assert learned[0]["switch_ms"] is not None and learned[0]["verify_ms"][1] > 0 and learned[0]["draft_ms"] > 0
    assert (alone["variant"], default["variant"]) == ("target-only", "default")
    assert alone["steps"] > 0 and default["steps"] > 0 and alone["ms_per_step"] > 0
    names = {run["variant"]: " ".join(name for name, _ in run["functions"]) for run in (alone, default)}
    assert "choose" in names["default"] and "choose" not in names["target-only"], names
    assert "acquire" not in names["default"] + names["target-only"]
    # what the default spends beyond the target alone names its plan; the target alone has no such list
    extra = dict(default["extra"])
    assert any("choose" in name for name in extra), extra
    assert "extra" not in alone
    # without the profiler: the parts add up to the step, and only the default plans anything worth timing
    for run in (alone, default):
        split = run["split"]
        assert split["step"] == pytest.approx(split["plan"] + split["draft"] + split["verify"] + split["other"])
    assert default["split"]["plan"] > 10 * alone["split"]["plan"], (alone["split"], default["split"])


def test_the_compute_threads_round_trip_is_timed_through_the_thread(monkeypatch) -> None:
    """The report's hand-over figure is a real round trip: a positive time, each call run on the compute thread."""
    import threading

    from localspec.app.engine import hand_over_seconds
    from localspec.llama import runtime

    ran_on, original = [], runtime.compute

    def recorded(fn, *args):
        return original(lambda: (ran_on.append(threading.get_ident()), fn(*args))[1])

    monkeypatch.setattr(runtime, "compute", recorded)
    assert 0.0 < hand_over_seconds(samples=20) < 0.05
    assert len(ran_on) == 20 and threading.get_ident() not in ran_on and len(set(ran_on)) == 1
