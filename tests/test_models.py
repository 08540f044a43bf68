"""The engine on the real demo pair: greedy identity, drafter invariance, rollback, KV reuse."""

from __future__ import annotations

import codecs

import numpy as np
import pytest

from localspec.app.templates import Message, build_messages
from localspec.core.model import common_prefix_length, sync_cache
from localspec.core.modes import make_mode
from localspec.core.sampling import SamplingParams, draft_weights
from localspec.core.text import ReplyText
from localspec.llama.model import LlamaModel

from .conftest import generate, make_engine

pytestmark = pytest.mark.models

RAW_PROMPTS = [
    "The history of the printing press begins",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "Once upon a time, in a small village by the sea, there lived",
    "Photosynthesis is the process by which plants",
]


@pytest.fixture(scope="module")
def engines(demo_paths):
    target, draft, weak = demo_paths
    built = {
        "q4_1": make_engine(target, draft),
        "q4_0": make_engine(target, weak),
        "none": make_engine(target, "none"),
    }
    yield built
    for engine in built.values():
        engine.close()


def test_greedy_speculative_equals_target_only(engines) -> None:
    speculative, plain = engines["q4_1"], engines["none"]
    greedy = SamplingParams(temperature=0.0)
    rejected_somewhere = False
    for text in RAW_PROMPTS:
        prompt = speculative.encode_raw(text).tokens
        expected, _ = generate(plain, prompt, greedy, mode="greedy", max_tokens=128)
        got, steps = generate(speculative, prompt, greedy, mode="greedy", max_tokens=128, draft_tokens=5)
        assert len(expected.token_ids) == 128, text
        assert got.token_ids == expected.token_ids, text
        assert got.text == expected.text
        rejected_somewhere |= any(s.n_accepted < len(s.drafted) for s in steps)
    assert rejected_somewhere, "the test never exercised a rejection"


def test_where_the_target_bounds_invariant_rows_greedy_verifies_within_them(engines, monkeypatch) -> None:
    """As on CUDA, where a batch of 9 rows leaves the one-row kernels: the bound (3 here) caps K in greedy
    mode for every front end's reply, adaptive too; sampling at T > 0 keeps its K (exact by rule)."""
    speculative, plain = engines["q4_1"], engines["none"]
    monkeypatch.setattr(LlamaModel, "invariant_rows", property(lambda model: 3))
    greedy = SamplingParams(temperature=0.0)
    prompt = speculative.encode_raw(RAW_PROMPTS[1]).tokens
    expected, _ = generate(plain, prompt, greedy, mode="greedy", max_tokens=48)
    for adaptive in (False, True):
        got, steps = generate(speculative, prompt, greedy, mode="greedy", max_tokens=48, draft_tokens=8,
                              adaptive=adaptive)  # fmt: skip
        assert got.token_ids == expected.token_ids
        assert steps and max(step.k for step in steps) <= 2, adaptive
        if adaptive:  # the controller chooses within 0..2
            controller = speculative.decoder.policy.controller
            assert (controller.k_max, controller.lookup_max) == (2, 2)  # lookup's copies too (32 unbounded)
        else:  # the cap, not a coincidence, bounds K
            assert max(step.k for step in steps) == 2
    _, steps = generate(speculative, prompt, SamplingParams(temperature=0.7), mode="rejection", max_tokens=48,
                        draft_tokens=5)  # fmt: skip
    assert max(len(step.drafted) for step in steps) == 5  # control: the bound is for invariance only


def test_greedy_with_weak_draft_and_prompt_lookup(engines, demo_paths) -> None:
    plain = engines["none"]
    greedy = SamplingParams(temperature=0.0)
    prompt = plain.encode_raw(RAW_PROMPTS[1]).tokens
    expected, _ = generate(plain, prompt, greedy, mode="greedy", max_tokens=128)
    got, _ = generate(engines["q4_0"], prompt, greedy, mode="greedy", max_tokens=128, draft_tokens=4)
    assert got.token_ids == expected.token_ids
    ngram = make_engine(demo_paths[0], "ngram")
    try:
        got, _ = generate(ngram, prompt, greedy, mode="greedy", max_tokens=128, draft_tokens=4)
        assert got.token_ids == expected.token_ids
    finally:
        ngram.close()
    # the bench's prompt-lookup variant on the pair's own engine: same text
    options = engines["q4_0"].options(mode="greedy", max_tokens=128, draft_tokens=4)
    events = list(engines["q4_0"].stream(prompt, options, greedy, drafter="ngram"))
    assert events[-1].token_ids == expected.token_ids


def test_invariant_mode_is_identical_with_any_draft(engines) -> None:
    params = SamplingParams(temperature=0.8)
    prompt = engines["none"].encode_chat([Message("user", "Tell me a short story about a cat.")]).tokens
    for seed in (1, 2, 3):
        outputs, accepted = {}, {}
        for name in ("q4_1", "q4_0", "none"):
            result, _ = generate(
                engines[name], prompt, params, mode="invariant", max_tokens=64, seed=seed, draft_tokens=4
            )
            outputs[name], accepted[name] = result.token_ids, result.stats.accepted
        assert outputs["q4_1"] == outputs["q4_0"] == outputs["none"], seed
        assert accepted["q4_1"] > 0 and accepted["none"] == 0


def test_rollback_leaves_exactly_the_committed_tokens(engines, demo_paths) -> None:
    engine = engines["q4_0"]  # weak draft: many rejections to roll back
    prompt = engine.encode_raw(RAW_PROMPTS[2]).tokens
    result, steps = generate(
        engine,
        prompt,
        SamplingParams(temperature=0.8),
        mode="rejection",
        max_tokens=80,
        seed=5,
        draft_tokens=4,
        adaptive=False,
    )  # fixed K: the same sample every run
    assert sum(len(s.drafted) - s.n_accepted for s in steps) > 5, "expected rejections"
    committed = prompt + result.token_ids
    target = engine.target
    assert list(target.cached_tokens) == committed[:-1]
    assert target.kv_positions() == (0, len(committed) - 2)  # nothing stale beyond the committed text
    after_speculation = target.extend([committed[-1]], 1)[0]
    fresh = LlamaModel(demo_paths[0], engine.settings)
    try:
        reference = fresh.extend(committed, 1)[0]
    finally:
        fresh.close()
    assert np.array_equal(after_speculation, reference)
    target.truncate(len(committed) - 1)


def test_draft_rollback_leaves_no_stale_entries(engines, demo_paths) -> None:
    """The draft evaluates its own proposals; after a rejection those entries must leave its KV cache.

    A stale entry left at a reused position would be attended to on the next
    step, so the draft's logits after a run with many rejections must equal a
    fresh draft model's on the committed text, bit for bit.
    """
    engine = engines["q4_0"]
    prompt = engine.encode_raw(RAW_PROMPTS[0]).tokens
    result, steps = generate(engine, prompt, SamplingParams(temperature=0.8), mode="rejection", max_tokens=80, seed=3,
                              draft_tokens=4, adaptive=False)  # fmt: skip
    # rejected proposals the draft had evaluated itself (all but the last of each draft)
    assert sum(max(0, len(s.drafted) - 1 - s.n_accepted) for s in steps) > 5, "expected evaluated drafts to roll back"
    committed = prompt + result.token_ids
    mode = make_mode("greedy", SamplingParams(temperature=0.0), np.random.default_rng(0), engine.drafter.vocab_size)
    proposal = engine.drafter.propose(committed, 1, mode)  # catches up: drops stale drafts, evaluates the rest
    draft = engine.drafter.model
    assert list(draft.cached_tokens) == committed
    assert draft.kv_positions() == (0, len(committed) - 1)
    fresh = LlamaModel(demo_paths[2], engine.settings, role="draft")  # the same weight placement, so the same kernels
    try:
        reference = fresh.extend(committed, 1)[0]
    finally:
        fresh.close()
    assert np.array_equal(proposal.logits[0], reference)


def test_borrowed_rows_are_llama_cpps_buffer_and_a_draft_keeps_copies(engines, demo_paths) -> None:
    """Verification reads the target's rows in llama.cpp's output buffer (``borrow``), which its next
    decode overwrites; so the draft copies every borrowed row it keeps. After a four-token proposal
    (three more decodes), each q a token was drawn from (the draft's head, its own few numbers) and
    each row kept where there is no q (greedy, for the UI's top-q) must still be that row's."""
    engine = engines["q4_0"]
    target = engine.target
    prompt = engine.encode_raw(RAW_PROMPTS[3]).tokens
    sync_cache(target, prompt[:-1])
    borrowed = target.extend([prompt[-1], 11, 12], 3, borrow=True)
    assert not borrowed.flags.writeable  # llama.cpp's buffer, not ours to change
    copied = np.array(borrowed)
    target.truncate(len(prompt) - 1)
    assert np.array_equal(copied, target.extend([prompt[-1], 11, 12], 3))
    target.truncate(len(prompt) - 1)
    target.extend([prompt[-1], 13, 14], 3, borrow=True)
    assert not np.array_equal(borrowed, copied)  # the next decode wrote over the borrowed rows
    target.truncate(len(prompt) - 1)

    params = SamplingParams(temperature=0.8)
    mode = make_mode("rejection", params, np.random.default_rng(4), engine.drafter.vocab_size)
    proposal = engine.drafter.propose(prompt, 4, mode)
    assert len(proposal.tokens) == 4
    fresh = LlamaModel(demo_paths[2], engine.settings, role="draft")
    greedy_mode = make_mode("greedy", params, np.random.default_rng(4), engine.drafter.vocab_size)
    greedy = engine.drafter.propose(prompt, 4, greedy_mode)
    try:
        for i, token in enumerate(proposal.tokens):
            fresh.reset()
            row = fresh.extend(prompt + proposal.tokens[:i], 1)[0]
            assert proposal.logits[i] is None  # its q, the draft's head, holds its own numbers: nothing kept
            assert proposal.q_rows[i].prob(token) == draft_weights(row, params).prob(token), i
            assert np.array_equal(proposal.q_rows[i].dense(), draft_weights(row, params).dense()), i
        for i in range(len(greedy.tokens)):  # no q: the UI's top-q reads the kept copies of the rows
            fresh.reset()
            assert np.array_equal(greedy.logits[i], fresh.extend(prompt + greedy.tokens[:i], 1)[0]), i
    finally:
        fresh.close()


def test_second_turn_evaluates_only_new_tokens(engines, demo_paths) -> None:
    engine = engines["q4_1"]
    greedy = SamplingParams(temperature=0.0)
    first_messages = build_messages("", [], "Name three colours.")
    first_prompt = engine.encode_chat(first_messages).tokens
    first, _ = generate(engine, first_prompt, greedy, mode="greedy", max_tokens=40)
    second_prompt = engine.encode_chat(
        build_messages("", [("Name three colours.", first.text)], "And three animals?")
    ).tokens
    cached = list(engine.target.cached_tokens)
    reused = common_prefix_length(cached, second_prompt[:-1])
    assert reused > len(first_prompt), "turn 1 should be reused"
    before = engine.target.n_evaluated
    second, steps = generate(engine, second_prompt, greedy, mode="greedy", max_tokens=40)
    assert second.stats.n_prompt_evaluated == len(second_prompt) - 1 - reused
    assert second.stats.n_prompt_evaluated < len(second_prompt) - len(first_prompt)
    # the target evaluated the new prompt tokens plus one verification batch per step, nothing more
    assert engine.target.n_evaluated - before == second.stats.n_prompt_evaluated + sum(
        1 + len(s.drafted) for s in steps
    )
    fresh = make_engine(demo_paths[0], demo_paths[1])
    try:
        again, _ = generate(fresh, second_prompt, greedy, mode="greedy", max_tokens=40)
        assert again.stats.n_prompt_evaluated == len(second_prompt) - 1
        assert again.token_ids == second.token_ids
    finally:
        fresh.close()


def test_context_full_is_a_clean_stop(demo_paths) -> None:
    engine = make_engine(demo_paths[0], demo_paths[1], **{"model.n_ctx": 64})
    try:
        n_ctx = engine.target.context_size  # llama.cpp rounds the requested 64 up (to 256)
        assert n_ctx >= 64
        # a counting prompt close to the end of the context: the continuation never ends by itself
        numbers, prompt = 1, []
        while True:
            longer = engine.encode_raw(", ".join(str(i) for i in range(1, numbers + 1)) + ",").tokens
            if len(longer) > n_ctx - 24:
                break
            prompt, numbers = longer, numbers + 1
        result, _ = generate(engine, prompt, SamplingParams(temperature=0.0), mode="greedy", max_tokens=500)
        assert result.stop_reason == "context_full"
        assert len(prompt) + len(result.token_ids) == n_ctx + 1
    finally:
        engine.close()


def test_utf8_characters_spanning_tokens_are_never_broken(engines) -> None:
    """Byte-fallback tokens split accents and CJK characters; no reply shows half of one, wherever it
    ends. Fixed K: with adaptive K the draft length follows measured timings, so the sample would too."""
    engine = engines["q4_1"]
    prompt = engine.encode_raw("Les élèves français écrivent: « Ça va très bien » — 日本語のテキスト:").tokens
    for seed in range(2, 10):  # the first sample with a byte-fallback token (any change of sampling changes it)
        result, _ = generate(engine, prompt, SamplingParams(temperature=1.0), max_tokens=60, seed=seed,
                             adaptive=False)  # fmt: skip
        pieces = [engine.target.token_bytes(t) for t in result.token_ids]
        if any(len(p) == 1 and p[0] >= 0x80 for p in pieces):
            break
    else:
        raise AssertionError("no byte-fallback token in eight samples: the test shows nothing")
    assert "\ufffd" not in result.text
    for cut in range(len(result.token_ids) + 1):  # every place a reply could stop
        reply = ReplyText(engine.target.token_bytes)
        for token in result.token_ids[:cut]:
            reply.push(token)
        reply.finish()
        assert reply.text == codecs.utf_8_decode(b"".join(pieces[:cut]), "replace", False)[0]
        assert "\ufffd" not in reply.text, cut


def test_weight_placement_keeps_amx_tiles_out_of_every_batch(engines, demo_paths, monkeypatch) -> None:
    """On an AMX build a draft AMX can hold keeps the fast AMX buffer but never runs tile instructions
    (they SIGILL on VMs like this one): with localspec's AMX patch the rows of a batch take the one-row
    kernels, without it every row is a decode of its own; either way a row equals the same row decoded
    alone. The target, which needs batches, never gets the AMX buffer."""
    from localspec.llama import placement, runtime

    engine = engines["q4_1"]
    target, draft = engine.target, engine.draft_model
    if "AMX_INT8 = 1" in placement.system_info():
        assert "AMX" in draft.weight_buffers and (draft.rows_per_decode == 1) != runtime.amx_rows_without_tiles()
        assert "AMX" not in target.weight_buffers and target.rows_per_decode > 1
    else:
        assert draft.rows_per_decode > 1 and target.rows_per_decode > 1
    if "AMX" in draft.weight_buffers:  # a two-token catch-up in one decode (or one per row) against rows alone
        base = len(draft.cached_tokens)
        rows = draft.extend([1000, 1001, 1002], 2)
        draft.truncate(base)
        draft.extend([1000], 0)
        first, second = draft.extend([1001], 1), draft.extend([1002], 1)
        draft.truncate(base)
        assert np.array_equal(rows, np.concatenate([first, second]))

    q4_1 = demo_paths[1]
    for value, extra, one_row in (("1", True, False), ("0", False, False)):
        monkeypatch.setenv("LOCALSPEC_EXTRA_BUFFERS", value)
        chosen = placement.weight_placement("draft", q4_1)
        assert (chosen.extra_buffers, chosen.one_row_per_decode, chosen.repack_only) == (extra, one_row, False)
    monkeypatch.delenv("LOCALSPEC_EXTRA_BUFFERS")
    monkeypatch.setattr(placement, "system_info", lambda: "CPU : AVX2 = 1 | AMX_INT8 = 1 | REPACK = 1")
    for patched in (False, True):  # one row per decode, unless the build runs batches without tiles
        monkeypatch.setattr(placement, "amx_rows_without_tiles", lambda: patched)
        draft_placement = placement.weight_placement("draft", q4_1)
        assert draft_placement == placement.WeightPlacement(True, not patched, draft_placement.reason)
        assert ("row by row" in draft_placement.reason) == patched
    target_placement = placement.weight_placement("target", q4_1)
    assert not target_placement.extra_buffers and target_placement.repack_only
    monkeypatch.setattr(placement, "system_info", lambda: "CPU : AVX2 = 1 | REPACK = 1")
    assert (
        placement.weight_placement("target", q4_1).extra_buffers
        and not placement.weight_placement("draft", q4_1).one_row_per_decode
    )


def test_amx_builds_repack_what_they_can_and_keep_a_mostly_q5_0_draft_out_of_amx(demo_paths, monkeypatch) -> None:
    """Without the AMX buffer a model's Q4_0/Q4_K matrices still go to llama.cpp's repacked buffer (an
    override per tensor: any other type there aborts the load), and a draft AMX cannot mostly hold is
    batched rather than fed one row at a time (the real pair's 0.5B: 55 % Q5_0)."""
    from localspec.llama import placement

    monkeypatch.setattr(placement, "system_info", lambda: "CPU : AVX2 = 1 | AMX_INT8 = 1 | REPACK = 1")
    f32, _, q4_0 = demo_paths
    overrides = placement.repack_overrides(q4_0)
    table = {name: kind for name, kind, _, _, _ in placement.gguf_tensor_table(str(q4_0))}
    named = [entry.pattern.decode()[1:-1].replace("\\", "") for entry in overrides[:-1]]
    assert overrides[len(overrides) - 1].pattern is None  # NULL-terminated, as llama.cpp reads it
    assert named and all(table[name] == "Q4_0" and name != "token_embd.weight" for name in named)
    assert {name for name, kind in table.items() if kind == "Q4_0" and name.startswith("blk.")} == set(named)
    assert placement.repack_overrides(f32) is None  # nothing to repack: no override list

    assert placement.gguf_tensor_table(str(q4_0.parent / "missing.gguf")) == ()  # left to the load to explain
    monkeypatch.setattr(placement, "gguf_tensor_table", lambda path: (
        ("token_embd.weight", "Q8_0", 2, 151936, 145_000_000),
        ("blk.0.ffn_up.weight", "Q5_0", 2, 4864, 3_000_000),
        ("blk.0.attn_q.weight", "Q4_K", 2, 896, 450_000),
        ("blk.0.ffn_down.weight", "Q6_K", 2, 896, 3_500_000),
    ))  # fmt: skip
    assert 0.5 < placement.amx_share("x.gguf") < placement.AMX_SHARE
    chosen = placement.weight_placement("draft", "x.gguf")
    assert chosen.repack_only and not chosen.extra_buffers and not chosen.one_row_per_decode


def test_every_load_and_decode_runs_on_one_thread_whoever_calls(demo_paths, monkeypatch) -> None:
    """libgomp keeps a worker pool per thread that opens a parallel region; two pools on two cores
    throttle every barrier (measured: the UI decoded at half speed). So a model loaded on one thread
    and decoded from others (the UI: Gradio's worker threads) must still compute on a single one."""
    import threading

    from localspec.llama.runtime import C

    callers: dict[str, set[int]] = {"load": set(), "context": set(), "decode": set()}

    def recorded(name, function):
        def call(*args):
            callers[name].add(threading.get_ident())
            return function(*args)

        return call

    monkeypatch.setattr(C, "llama_model_load_from_file", recorded("load", C.llama_model_load_from_file))
    monkeypatch.setattr(C, "llama_init_from_model", recorded("context", C.llama_init_from_model))
    monkeypatch.setattr(C, "llama_decode", recorded("decode", C.llama_decode))
    model = LlamaModel(demo_paths[1], role="draft")  # loaded here, on the test's thread
    try:
        logits = {"here": model.extend([1, 2, 3], 1)}
        for name in ("worker a", "worker b"):  # each reply of the UI may come on another thread
            model.truncate(0)
            worker = threading.Thread(target=lambda n=name: logits.__setitem__(n, model.extend([1, 2, 3], 1)))
            worker.start()
            worker.join()
    finally:
        model.close()
    assert len(logits) == 3 and all(np.array_equal(logits["here"], row) for row in logits.values())
    used = callers["load"] | callers["context"] | callers["decode"]
    assert len(used) == 1 and callers["decode"] == callers["load"], callers
    assert threading.get_ident() not in used


def test_a_decodes_seconds_include_waiting_for_the_device(demo_paths, monkeypatch) -> None:
    """A GPU (or an RPC server) computes after ``llama_decode`` returns; the adaptive controller learns each
    batch size's cost from the decode's seconds, so they must end when the outputs are in, not at the launch.
    The device stands in as a ``llama_synchronize`` during which a thousand seconds pass."""
    import time

    from localspec.llama.runtime import C

    passed = [0.0]
    clock = time.perf_counter
    monkeypatch.setattr(time, "perf_counter", lambda: clock() + passed[0])

    def device_finishes(ctx) -> None:
        passed[0] += 1000.0

    monkeypatch.setattr(C, "llama_synchronize", device_finishes)
    model = LlamaModel(demo_paths[1], role="draft")
    try:
        before, began = model.decode_seconds, clock()
        model.extend([1, 2, 3], 1)
        assert 1000.0 <= model.decode_seconds - before <= 1000.0 + (clock() - began)  # the device's, plus real time
    finally:
        model.close()


@pytest.mark.parametrize("one_row_up_to", [4, 0])
def test_a_draft_on_cuda_reads_a_short_catch_up_one_row_at_a_time_each_with_its_output(
    demo_paths, monkeypatch, one_row_up_to: int
) -> None:
    """On a CUDA GPU (stood in: ``one_row_up_to`` as a draft there gets it) every decode of a short extend is
    one token with its output, the shape of a proposal's decode, so llama.cpp reuses one graph; a long
    extend (a prompt) is still one batch. The control (0, as on a CPU) batches the catch-up."""
    from localspec.llama.runtime import C

    shapes = []  # (tokens, outputs) of each decode

    def recorded(ctx, batch):
        shapes.append((batch.n_tokens, sum(bool(batch.logits[i]) for i in range(batch.n_tokens))))
        return decode(ctx, batch)

    decode = C.llama_decode
    monkeypatch.setattr(C, "llama_decode", recorded)
    model = LlamaModel(demo_paths[1], role="draft")
    try:
        model.one_row_up_to = one_row_up_to
        prompt = model.tokenize("def quicksort(items):\n    if len(items) < 2:\n        return items\n")
        model.extend(prompt, 1)
        batched = model.extend([11, 12], 1)[0].copy()  # a catch-up of two tokens
        model.truncate(len(prompt))
        shapes_before = list(shapes)
        model.rows_per_decode, model.one_row_up_to = 1, 0  # the same two tokens read one by one, as a reference
        one_by_one = model.extend([11, 12], 1)[0]
    finally:
        model.close()
    assert shapes_before[0] == (len(prompt), 1)  # the prompt: one batch whatever the bound
    expected = [(1, 1), (1, 1)] if one_row_up_to else [(2, 1)]
    assert shapes_before[1:] == expected
    assert np.allclose(batched, one_by_one, atol=1e-3)


def test_a_target_takes_the_amx_buffer_only_with_streamed_kernels_for_nearly_all_of_it(monkeypatch) -> None:
    """With localspec's streamed-rows patch a Q4_K_M target decodes 1 / 3 / 8 rows in 46-48 / 60 / 96 ms in
    the AMX buffer against 66 / 71 / 139 repacked (real pair, AMX VM); without it, or with matrices the
    patch has no batch kernel for (Q5_0 here), batches there ran the one-row kernel once per row."""
    from localspec.llama import placement

    monkeypatch.delenv("LOCALSPEC_EXTRA_BUFFERS", raising=False)
    monkeypatch.setattr(placement, "system_info", lambda: "CPU : AVX2 = 1 | AMX_INT8 = 1 | REPACK = 1")
    monkeypatch.setattr(placement, "amx_rows_without_tiles", lambda: True)
    q4_k_m = (("blk.0.ffn_up.weight", "Q4_K", 2, 8960, 7_700_000), ("output.weight", "Q6_K", 2, 151936, 191_000_000))
    mostly_q5_0 = (("blk.0.ffn_up.weight", "Q5_0", 2, 8960, 9_000_000), ("output.weight", "Q6_K", 2, 151936, 1_000_000))
    for table, streamed, amx in ((q4_k_m, True, True), (q4_k_m, False, False), (mostly_q5_0, True, False)):
        monkeypatch.setattr(placement, "gguf_tensor_table", lambda path, table=table: table)
        monkeypatch.setattr(placement, "amx_streamed_rows", lambda streamed=streamed: streamed)
        chosen = placement.weight_placement("target", "x.gguf")
        assert (chosen.extra_buffers, chosen.repack_only, chosen.one_row_per_decode) == (amx, not amx, False)
        assert ("streamed" in chosen.reason) == amx


@pytest.mark.parametrize(("n_ctx", "n_batch"), [(4096, 512), (1024, 64)])
def test_the_memory_estimate_is_what_llama_cpp_allocates(n_ctx: int, n_batch: int) -> None:
    """The doctor judges whether a pair fits before loading it, from the GGUF's tensor table
    (localspec.llama.footprint): its KV cache must be what llama.cpp allocates to the byte, its compute buffer
    within 5 %, its weights within 2 % of the model buffers (no extra buffers), for the real pair, the demo
    target and Gemma 3 (two KV caches: sliding-window layers), read from llama.cpp's own log at load."""
    from localspec.llama.footprint import footprint
    from localspec.llama.model import LlamaSettings

    from .conftest import GEMMA, QWEN_DRAFT, QWEN_TARGET, TARGET, require

    require(QWEN_TARGET, QWEN_DRAFT, TARGET, GEMMA)
    for path in (QWEN_TARGET, QWEN_DRAFT, TARGET, GEMMA):
        settings = LlamaSettings(n_ctx=n_ctx, n_batch=n_batch, threads=1, extra_buffers=False)  # no repacked copies
        model = LlamaModel(path, settings)
        try:
            on_gpus, on_cpu = footprint(path, n_ctx, n_batch)
            allocated = {kind: sum(sizes.values()) * 2**20 for kind, sizes in model.context_buffer_mib.items()}
            weights = sum(model.weight_buffer_mib.values()) * 2**20
        finally:
            model.close()
        assert on_gpus.total == 0, path.name  # no GPU named: everything on the CPU
        assert abs(on_cpu.kv_cache - allocated["KV"]) < 0.01 * 2**20, (path.name, on_cpu, allocated)
        assert abs(on_cpu.compute / allocated["compute"] - 1) < 0.05, (path.name, on_cpu, allocated)
        assert abs(on_cpu.weights / weights - 1) < 0.02, (path.name, on_cpu, weights)
