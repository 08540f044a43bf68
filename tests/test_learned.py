"""What adaptive drafting learnt survives the process (issue 39, goal 3).

A new process starts from the costs and acceptance the last one ended with,
kept per pair, settings, build and machine in the user's cache, so its first
reply neither times the models again nor drafts from the prior. A file that
is corrupt, of another version or for another build or machine is ignored.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import localspec.drafting.policy as policy
from localspec.app import learned as store
from localspec.core.loop import SpeculativeDecoder
from localspec.core.options import GenerationOptions
from localspec.core.sampling import SamplingParams
from localspec.drafting.adaptive import Learned
from localspec.drafting.calibrate import Costs
from localspec.drafting.drafters import ModelDrafter
from localspec.drafting.policy import speculative_decoder

from .test_adaptive import ClockedLM, gpu_verify

V = 6
OPTIONS = GenerationOptions(max_tokens=60, draft_tokens=8, adaptive=True, min_draft_tokens=0, seed=3, lookup=False)
PARAMS = SamplingParams(temperature=0.7)


def clocked_pair() -> SpeculativeDecoder:
    """A GPU-like pair where drafting pays: verification barely grows with rows, a draft token is cheap,
    and the draft is the target plus a little noise."""
    target = ClockedLM(V, seed=11, cost=gpu_verify)
    draft = ClockedLM(V, seed=12, base=target, noise=0.3, cost=lambda rows: 0.001 * rows)
    return speculative_decoder(target, target, ModelDrafter(draft))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_CACHE", str(tmp_path))
    return tmp_path


def counted_calibrations(monkeypatch) -> list[int]:
    calls: list[int] = []
    measure = policy.measure_costs

    def counting(*args, **kwargs):
        calls.append(1)
        return measure(*args, **kwargs)

    monkeypatch.setattr(policy, "measure_costs", counting)
    return calls


def test_a_new_decoder_resumes_where_the_last_one_ended(cache, monkeypatch) -> None:
    """The learnt state goes through the file unchanged, and a decoder that resumes it neither times the
    models before its first step nor starts from the prior acceptance. Control: a fresh decoder does both."""
    calibrations = counted_calibrations(monkeypatch)
    first = clocked_pair()
    first.run([1, 2, 3], PARAMS, OPTIONS)
    assert calibrations == [1]
    state = first.policy.learned()
    ((settings, learned_state),) = state.items()
    assert learned_state.examined > 10 and learned_state.costs.verify_s[1] == pytest.approx(gpu_verify(1))
    store.save("pair-key", state, "toy pair")
    assert store.load("pair-key") == state  # exactly, floats and settings included

    resumed = clocked_pair()
    resumed.policy.resume(store.load("pair-key"))
    resumed.run([1, 2, 3], PARAMS, OPTIONS)
    assert calibrations == [1]  # no timing before the first step
    assert resumed.policy.controller.history[0] > 0  # drafts from the first step, as the last reply ended

    fresh = clocked_pair()  # control
    controller = fresh.policy._controller(OPTIONS, PARAMS)
    assert calibrations == [1, 1]
    assert controller.acceptance.alpha == pytest.approx(controller.acceptance.alpha_prior)
    resumed_alpha = speculative_decoder(fresh.target, fresh.target, fresh.drafter)
    resumed_alpha.policy.resume(state)
    assert resumed_alpha.policy._controller(OPTIONS, PARAMS).acceptance.alpha == pytest.approx(
        first.policy.controller.acceptance.alpha
    )


def test_new_settings_start_from_the_learnt_costs(cache, monkeypatch) -> None:
    """Costs belong to the pair, acceptance to the settings: a controller for another temperature starts
    from the prior acceptance but from the learnt costs, without timing the models again."""
    calibrations = counted_calibrations(monkeypatch)
    first = clocked_pair()
    first.run([1, 2, 3], PARAMS, OPTIONS)
    resumed = clocked_pair()
    resumed.policy.resume(first.policy.learned())
    controller = resumed.policy._controller(OPTIONS, SamplingParams(temperature=0.0))
    assert calibrations == [1]
    assert controller.acceptance.alpha == pytest.approx(controller.acceptance.alpha_prior)
    assert controller.costs.verify_seconds(1) == pytest.approx(first.policy.controller.costs.verify_seconds(1))


STATE = {("rejection", 0.7, 0, 8, True): Learned(Costs({1: 0.02, 4: 0.03}, 0.004, 0.001, 1e-4, 0.002), 12.5, 20.0,
                                                  {16: (3.0, 4.0)})}  # fmt: skip


@pytest.mark.parametrize("damage", [
    "not json {", '{"version": 1, "entries": []}', '{"version": 99, "entries": {}}', "[]", "",
    "version-bump", "nan-cost", "negative-cost", "string-count", "truncated",
])  # fmt: skip
def test_a_damaged_file_is_ignored_and_replaced(cache, damage: str) -> None:
    """Whatever is in the file, loading never raises: a damaged or foreign file reads as nothing learnt,
    and the next save replaces it. Control: the undamaged file reads back."""
    store.save("k", STATE, "about")
    assert store.load("k") == STATE
    path = store.store_path()
    data = json.loads(path.read_text())
    item = data["entries"]["k"]["controllers"][0]
    if damage == "version-bump":
        data["version"] += 1
    elif damage == "nan-cost":
        item["verify_s"]["1"] = float("nan")
    elif damage == "negative-cost":
        item["draft_token_s"] = -0.1
    elif damage == "string-count":
        item["accepted"] = "many"
    text = json.dumps(data) if damage in ("version-bump", "nan-cost", "negative-cost", "string-count") else damage
    path.write_text(path.read_text()[:40] if damage == "truncated" else text)
    assert store.load("k") == {}
    store.save("k", STATE, "about")
    assert store.load("k") == STATE


@pytest.mark.parametrize("failure", [OSError("disk full"), KeyboardInterrupt()])
def test_a_save_cut_short_leaves_no_temporary_file(cache, monkeypatch, failure: BaseException) -> None:
    """A rename that fails, or Ctrl-C between the write and the rename, leaves the cache as it was: the
    last file saved, and no temporary file (empty ones piled up in a user's cache). A failed save is
    quiet; Ctrl-C still interrupts."""
    store.save("k", STATE, "about")
    before = store.store_path().read_text()

    def fail(self, target):
        raise failure

    monkeypatch.setattr(type(store.store_path()), "replace", fail)
    if isinstance(failure, KeyboardInterrupt):
        with pytest.raises(KeyboardInterrupt):
            store.save("other", STATE, "about")
    else:
        store.save("other", STATE, "about")
    assert sorted(p.name for p in store.store_path().parent.iterdir()) == [store.store_path().name]
    assert store.store_path().read_text() == before


def test_entries_are_per_key_and_the_oldest_go_first(cache, monkeypatch) -> None:
    monkeypatch.setattr(store, "MAX_ENTRIES", 3)
    for key in "abcd":
        store.save(key, STATE, key)
    assert store.load("a") == {} and all(store.load(key) == STATE for key in "bcd")
    store.save("b", STATE, "b")  # saved again: now the newest
    store.save("e", STATE, "e")
    assert store.load("c") == {} and store.load("b") == STATE


def test_another_build_or_machine_has_another_key(tmp_path, monkeypatch) -> None:
    """What one build or machine learnt is never used by another: both are part of the key, as are the
    files and the load settings. Control: the same facts give the same key."""
    from localspec.llama import runtime

    target, draft = tmp_path / "t.gguf", tmp_path / "d.gguf"
    target.write_bytes(b"t" * 10)
    draft.write_bytes(b"d" * 10)
    settings = {"threads": 2}
    key = store.identity(target, draft, settings)
    assert store.identity(target, draft, settings) == key
    assert store.identity(target, draft, {"threads": 1}) != key
    assert store.identity(target, None, settings) != key
    monkeypatch.setattr(store, "build_id", lambda: "another build")
    assert store.identity(target, draft, settings) != key
    monkeypatch.undo()
    real = runtime.devices()
    gpu = runtime.Device("CUDA0", "NVIDIA H100", "gpu", "CUDA", 0, 0)
    monkeypatch.setattr(runtime, "devices", lambda: (*real, gpu))
    assert store.identity(target, draft, settings) != key
    target.write_bytes(b"t" * 11)  # the file changed
    monkeypatch.undo()
    assert store.identity(target, draft, settings) != key


@pytest.mark.models
def test_a_new_engine_on_the_demo_pair_resumes_the_last_ones_costs(demo_paths, cache, monkeypatch) -> None:
    """End to end on llama.cpp: an engine that remembers saves after its reply, and the next engine on the
    same pair starts with those costs, so its first reply times nothing. Control: with ``remember`` off
    nothing is saved and the next engine times the models."""
    from .conftest import make_engine

    target, draft, _ = demo_paths
    calibrations = counted_calibrations(monkeypatch)
    options = GenerationOptions(max_tokens=24, draft_tokens=4, adaptive=True, seed=1)
    prompt = [1, 2, 3, 4]

    def reply(remember: bool):
        engine = make_engine(target, draft, **{"speculative.remember": remember})
        try:
            list(engine.stream(prompt, options))
            return engine.decoder
        finally:
            engine.close()

    reply(remember=False)
    assert calibrations == [1] and not store.store_path().exists()
    first = reply(remember=True)
    assert calibrations == [1, 1] and store.store_path().exists()
    second = reply(remember=True)
    assert calibrations == [1, 1]  # resumed: nothing timed
    assert second.policy.costs == list(first.policy.learned().values())[-1].costs
    # a reply no controller drafted (the target alone, or a fixed K) teaches nothing: the file is not written
    saves = []
    monkeypatch.setattr(store, "save", lambda *args: saves.append(args))
    engine = make_engine(target, draft, **{"speculative.remember": True})
    try:
        for fixed in (replace(options, mode="target-only"), replace(options, adaptive=False), options):
            list(engine.stream(prompt, fixed))
    finally:
        engine.close()
    assert len(saves) == 1  # the adaptive reply's alone
