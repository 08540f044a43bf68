"""The generation loop on toy models: greedy identity, drafter invariance, stops, caches."""

from __future__ import annotations

import codecs
import itertools
import threading
from dataclasses import replace

import numpy as np
import pytest

from localspec.app.records import with_position_records
from localspec.core.errors import ConfigError, PromptTooLongError
from localspec.core.events import GenerationResult, GenerationStats, StepEvent, TokenEvent, TokenStatus
from localspec.core.modes import RejectionMode
from localspec.core.options import GenerationOptions
from localspec.core.sampling import SamplingParams
from localspec.core.text import ReplyText
from localspec.drafting.drafters import ModelDrafter, NgramDrafter
from localspec.drafting.policy import speculative_decoder

from .toy import ToyLM, greedy_reference

V = 6


def pair(noise: float = 1.2, draft_vocab: int = V, **target_kwargs):
    target = ToyLM(V, seed=11, scale=1.6, **target_kwargs)
    draft = ToyLM(draft_vocab, seed=23, base=target, noise=noise)
    return target, draft


def run(decoder, prompt, params=SamplingParams(temperature=0.8), **options):
    return decoder.run(prompt, params, GenerationOptions(**options))


# ---------------------------------------------------------------------------
# greedy: byte-identical to target-only, over all short prompts
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("noise", [0.5, 3.0])  # a good and a bad draft
def test_greedy_equals_target_only_for_all_prefixes(noise: float) -> None:
    target, draft = pair(noise=noise)
    speculative = speculative_decoder(target, target, ModelDrafter(draft))
    greedy = SamplingParams(temperature=0.0)
    prompts = [list(p) for n in (1, 2) for p in itertools.product(range(V), repeat=n)]
    for prompt in prompts:
        expected = greedy_reference(target, prompt, 12)
        for k in (1, 3, 5):
            got = run(speculative, prompt, greedy, mode="greedy", max_tokens=12, draft_tokens=k).token_ids
            assert got == expected, (prompt, k)
        assert run(speculative, prompt, greedy, mode="target-only", max_tokens=12).token_ids == expected
        # rejection mode at T = 0 is greedy too
        assert run(speculative, prompt, greedy, mode="rejection", max_tokens=12, draft_tokens=4).token_ids == expected


def test_greedy_with_ngram_drafter_equals_target_only() -> None:
    target, _ = pair()
    decoder = speculative_decoder(target, target, NgramDrafter(target))
    for prompt in itertools.product(range(V), repeat=3):
        expected = greedy_reference(target, prompt, 10)
        got = run(decoder, list(prompt), SamplingParams(temperature=0.0), mode="greedy", max_tokens=10, draft_tokens=4)
        assert got.token_ids == expected


# ---------------------------------------------------------------------------
# invariant mode: same seed, same text, whatever the draft
# ---------------------------------------------------------------------------
def test_invariant_mode_text_does_not_depend_on_the_drafter() -> None:
    target = ToyLM(V, seed=11, scale=1.6)
    draft_a = ToyLM(V, seed=23, base=target, noise=0.8)
    draft_b = ToyLM(V, seed=99, base=target, noise=3.0)
    decoders = {
        "draft A": speculative_decoder(target, target, ModelDrafter(draft_a)),
        "draft B": speculative_decoder(target, target, ModelDrafter(draft_b)),
        "no draft": speculative_decoder(target, target, None),
    }
    params = SamplingParams(temperature=0.8)
    accepted = {name: 0 for name in decoders}
    for seed in range(2000):
        outputs = {}
        for name, decoder in decoders.items():
            result = run(decoder, [1, 2, 3], params, mode="invariant", max_tokens=16, draft_tokens=3, seed=seed)
            outputs[name] = result.token_ids
            accepted[name] += result.stats.accepted
        assert len(set(map(tuple, outputs.values()))) == 1, (seed, outputs)
    # the drafts really did something different (otherwise the test would be vacuous)
    assert accepted["draft A"] > accepted["draft B"] > 0 and accepted["no draft"] == 0


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.8, top_k=4, top_p=0.9, min_p=0.05),
    SamplingParams(temperature=0.8, repeat_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.5, penalty_last_n=4),
], ids=["top-k top-p min-p", "penalties"])  # fmt: skip
def test_invariant_mode_with_filters_and_penalties_does_not_depend_on_the_drafter(params: SamplingParams) -> None:
    """Filters zero out tokens the draft may still propose; penalties depend on the drafted history."""
    target = ToyLM(V, seed=11, scale=1.6)
    decoders = {
        "draft": speculative_decoder(target, target, ModelDrafter(ToyLM(V, seed=23, base=target, noise=1.5))),
        "prompt lookup": speculative_decoder(target, target, NgramDrafter(target)),
        "no draft": speculative_decoder(target, target, None),
    }
    accepted = 0
    for seed in range(400):
        outputs = set()
        for name, decoder in decoders.items():
            result = run(decoder, [1, 2, 1, 2, 1], params, mode="invariant", max_tokens=16, draft_tokens=3, seed=seed)
            outputs.add(tuple(result.token_ids))
            accepted += result.stats.accepted if name == "draft" else 0
        assert len(outputs) == 1, (seed, outputs)
    assert accepted > 0


def test_invariant_mode_with_prompt_lookup_matches_no_draft() -> None:
    target = ToyLM(V, seed=11, scale=1.6)
    ngram = speculative_decoder(target, target, NgramDrafter(target))
    plain = speculative_decoder(target, target, None)
    params = SamplingParams(temperature=0.8)
    for seed in range(300):
        a = run(ngram, [1, 2, 1, 2, 1], params, mode="invariant", max_tokens=16, draft_tokens=3, seed=seed)
        b = run(plain, [1, 2, 1, 2, 1], params, mode="invariant", max_tokens=16, seed=seed)
        assert a.token_ids == b.token_ids


def test_invariant_mode_changes_with_seed_and_request_key() -> None:
    target, draft = pair()
    decoder = speculative_decoder(target, target, ModelDrafter(draft))
    params = SamplingParams(temperature=0.8)
    texts = {tuple(run(decoder, [0], params, mode="invariant", max_tokens=16, seed=s).token_ids) for s in range(20)}
    assert len(texts) > 10
    a = run(decoder, [0], params, mode="invariant", max_tokens=16, seed=1, request_key=1).token_ids
    b = run(decoder, [0], params, mode="invariant", max_tokens=16, seed=1, request_key=2).token_ids
    assert a != b


# ---------------------------------------------------------------------------
# statuses, stops and limits
# ---------------------------------------------------------------------------
def test_statuses_follow_the_verdicts() -> None:
    target, draft = pair()
    decoder = speculative_decoder(target, target, ModelDrafter(draft))
    events = list(
        decoder.stream(
            [0, 1], SamplingParams(temperature=0.8), GenerationOptions(max_tokens=40, draft_tokens=3, seed=4)
        )
    )
    steps = [e for e in events if isinstance(e, StepEvent)]
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    result = events[-1]
    assert isinstance(result, GenerationResult)
    expected: list[TokenStatus] = []
    for step in steps:
        expected += [TokenStatus.ACCEPTED] * step.n_accepted
        if not step.drafted:  # the reply's last token: no room left to draft
            expected.append(TokenStatus.TARGET)
        else:
            expected.append(TokenStatus.BONUS if step.bonus else TokenStatus.CORRECTED)
    assert [t.status for t in tokens] == expected == result.statuses
    assert {TokenStatus.ACCEPTED, TokenStatus.CORRECTED, TokenStatus.BONUS} <= set(expected)
    assert [t.index for t in tokens] == list(range(len(tokens)))
    corrected = [t for t in tokens if t.status is TokenStatus.CORRECTED]
    assert all(t.rejected_token is not None and t.uniform >= t.accept_prob for t in corrected)
    accepted = [t for t in tokens if t.status is TokenStatus.ACCEPTED]
    assert all(t.uniform < t.accept_prob for t in accepted)
    assert result.stats.n_tokens == len(tokens) == 40
    assert 0 < result.stats.acceptance_rate < 1


def test_target_only_tokens_are_marked_target() -> None:
    target, draft = pair()
    result = run(speculative_decoder(target, target, ModelDrafter(draft)), [0], mode="target-only", max_tokens=8)
    assert result.statuses == [TokenStatus.TARGET] * 8 and result.stats.drafted == 0


def test_end_of_generation_token_stops_and_is_not_emitted() -> None:
    target = ToyLM(V, seed=11, scale=1.6, eos=greedy_reference(ToyLM(V, seed=11, scale=1.6), [2], 6)[3])
    draft = ToyLM(V, seed=23, base=target, noise=0.3)
    decoder = speculative_decoder(target, target, ModelDrafter(draft))
    result = run(decoder, [2], SamplingParams(temperature=0.0), mode="greedy", max_tokens=50, draft_tokens=4)
    assert result.stop_reason == "eos"
    assert result.token_ids == greedy_reference(target, [2], 50, eos=target.eos)
    assert target.eos not in result.token_ids


def test_drafts_accepted_past_an_end_of_generation_are_not_counted() -> None:
    """The draft agrees with the target everywhere, so the verifier accepts all 4 drafts of the first step,
    the second of which is EOS: the reply takes 1 token and the EOS, so 2 drafts were accepted, not 4."""
    plain = ToyLM(V, seed=11, scale=1.6)
    eos = greedy_reference(plain, [2], 6)[1]
    assert eos != greedy_reference(plain, [2], 6)[0]
    target = ToyLM(V, seed=11, scale=1.6, eos=eos)
    draft = ToyLM(V, seed=23, base=target, noise=0.0)  # identical logits: every draft accepted
    decoder = speculative_decoder(target, target, ModelDrafter(draft))
    events = list(decoder.stream([2], SamplingParams(temperature=0.0),
                                 GenerationOptions(mode="greedy", max_tokens=50, draft_tokens=4,
                                                   adaptive=False)))  # fmt: skip
    result, step = events[-1], next(e for e in events if isinstance(e, StepEvent))
    assert step.n_accepted == 4 and step.drafted[1] == eos  # the verifier's own decision, kept in the trace
    assert result.stop_reason == "eos" and result.stats.n_tokens == 1
    assert result.stats.accepted == 2 and result.stats.drafted == 4
    assert result.stats.accepted_by_position[:4] == [1, 1, 0, 0]


def test_stats_rebuilt_from_the_steps_equal_the_loops_own() -> None:
    """A trace's steps give back the reply's counters exactly (the UI and saved traces rebuild them so),
    including replies that end at an EOS inside accepted drafts or at a stop string."""
    plain = ToyLM(V, seed=11, scale=1.6)
    eos = greedy_reference(plain, [2], 6)[1]
    decoders = []
    for target in (ToyLM(V, seed=11, scale=1.6, eos=eos), plain):
        decoders.append(speculative_decoder(target, target, ModelDrafter(ToyLM(V, seed=23, base=target, noise=0.6))))
    endings = set()
    for seed in range(60):
        decoder = decoders[seed % 2]
        options = GenerationOptions(mode=("rejection", "greedy", "invariant", "target-only")[seed % 4], max_tokens=30,
                                    draft_tokens=1 + seed % 5, seed=seed, adaptive=seed % 3 == 0,
                                    stop=["cb"] if seed % 3 == 1 else ())  # fmt: skip
        events = list(decoder.stream([2, 3], SamplingParams(temperature=0.0 if seed % 4 == 1 else 0.8), options))
        result = events[-1]
        own = result.stats
        rebuilt = GenerationStats.from_steps([e.to_dict() for e in events if isinstance(e, StepEvent)],
                                             mode=own.mode, drafter=own.drafter, seed=own.seed, k=own.k,
                                             n_prompt=own.n_prompt, n_prompt_evaluated=own.n_prompt_evaluated,
                                             prefill_s=own.prefill_s, wall_s=own.wall_s)  # fmt: skip
        assert rebuilt == own, seed
        if result.stop_reason != "stop_string":  # (the tokens of a stop string were generated but are not shown)
            assert own.n_tokens == len(result.token_ids)
        endings.add(result.stop_reason)
    assert {"eos", "max_tokens", "stop_string"} <= endings


def test_max_tokens_is_exact_and_limits_the_draft() -> None:
    target, draft = pair(noise=0.1)
    decoder = speculative_decoder(target, target, ModelDrafter(draft))
    for n in (1, 2, 5, 9):
        events = list(
            decoder.stream([3], SamplingParams(temperature=0.8), GenerationOptions(max_tokens=n, draft_tokens=4))
        )
        result = events[-1]
        assert result.stop_reason == "max_tokens" and len(result.token_ids) == n
        assert all(e.k <= n - 1 for e in events if isinstance(e, StepEvent))


def test_context_full_is_a_clean_stop() -> None:
    target = ToyLM(V, seed=11, scale=1.6, context_size=20)
    draft = ToyLM(V, seed=23, base=target, noise=1.0, context_size=20)
    decoder = speculative_decoder(target, target, ModelDrafter(draft))
    result = run(decoder, [0, 1, 2, 3, 4], max_tokens=100, draft_tokens=4)
    assert result.stop_reason == "context_full"
    assert len(result.token_ids) == 20 - 5 + 1  # the last position's token needs no evaluation


def test_prompt_longer_than_context_is_refused_with_sizes() -> None:
    target, draft = pair(context_size=8)
    decoder = speculative_decoder(target, target, ModelDrafter(draft))
    with pytest.raises(PromptTooLongError, match="9 tokens but the context holds 8"):
        run(decoder, list(range(6)) + [0, 1, 2])


def test_empty_prompt_is_refused() -> None:
    target, _ = pair()
    with pytest.raises(ConfigError, match="empty"):
        run(speculative_decoder(target, target, None), [])


def test_stop_string_truncates_and_never_shows() -> None:
    target, draft = pair()
    decoder = speculative_decoder(target, target, ModelDrafter(draft))
    full = run(decoder, [0], SamplingParams(temperature=0.0), mode="greedy", max_tokens=20)
    stop = full.text[5:7]
    events = list(
        decoder.stream(
            [0], SamplingParams(temperature=0.0), GenerationOptions(mode="greedy", max_tokens=20, stop=[stop])
        )
    )
    result = events[-1]
    streamed = "".join(e.text for e in events if isinstance(e, TokenEvent))
    assert result.stop_reason == "stop_string"
    assert result.text == streamed == full.text[: full.text.index(stop)]
    assert stop not in streamed


class MultiByteLM(ToyLM):
    """A toy whose pieces include a character split over two tokens (é = C3 | A9) and a 3-byte one (→)."""

    PIECES = [b"\xc3", b"\xa9", b"a", "→".encode(), b" ", b"b"]

    def token_bytes(self, token: int) -> bytes:
        return self.PIECES[token]


def test_stop_strings_across_steps_in_sampling_mode_with_multibyte_tokens() -> None:
    """Rejection sampling, K = 3: a stop string whose tokens come from two different steps,
    or whose character is split between two tokens, still ends the reply exactly before it,
    never shows any of it, and does not change the sample before it."""
    target = MultiByteLM(V, seed=11, scale=1.6)
    draft = MultiByteLM(V, seed=23, base=target, noise=1.0)
    decoder = speculative_decoder(target, target, ModelDrafter(draft))
    params = SamplingParams(temperature=0.8)
    stops = ["é", "a→", "→ b", "éa"]
    across_steps = split_character = 0
    for seed in range(60):
        options = GenerationOptions(mode="rejection", max_tokens=40, draft_tokens=3, seed=seed, adaptive=False)
        full_events = list(decoder.stream([2], params, options))
        full = full_events[-1]
        step_of = [e.step for e in full_events if isinstance(e, TokenEvent)]
        for stop in stops:
            if stop not in full.text:
                continue
            cut = full.text.index(stop)
            events = list(decoder.stream([2], params, replace(options, stop=[stop])))
            result = events[-1]
            streamed = "".join(e.text for e in events if isinstance(e, TokenEvent))
            assert result.stop_reason == "stop_string", (seed, stop)
            assert result.text == streamed == full.text[:cut], (seed, stop)
            assert result.token_ids == full.token_ids[: len(result.token_ids)]  # same sample up to the stop
            # which tokens carried the stop string: their steps, and whether one split a character
            ends = [len(complete_characters(b"".join(MultiByteLM.PIECES[t] for t in full.token_ids[: i + 1])))
                    for i in range(len(full.token_ids))]  # fmt: skip
            first = next(i for i, end in enumerate(ends) if end > cut)  # completes the stop's first character
            last = next(i for i, end in enumerate(ends) if end >= cut + len(stop))
            split = stop[0] == "é" and first > 0 and full.token_ids[first - 1] == 0  # its lead byte came before
            first -= split
            across_steps += step_of[first] != step_of[last]
            split_character += split and step_of[first] != step_of[first + 1]
    assert across_steps >= 5 and split_character >= 5, (across_steps, split_character)


def complete_characters(data: bytes) -> str:
    """The text of ``data`` up to its last complete character; bad bytes mid-way become U+FFFD."""
    return codecs.utf_8_decode(data, "replace", False)[0]


def test_reply_text_never_breaks_a_character_and_drops_a_dangling_one() -> None:
    pieces = {1: "アニ".encode(), 2: b"\xe3", 3: b"\x83", 4: b"\xa1", 5: b"z", 6: b"\x83\xa1\xe3", 7: b"\xff"}
    sequences = [
        [1, 2, 3, 4],
        [1, 2, 3],
        [1, 2],
        [2, 3, 4, 1, 2],
        [5, 2],
        [5, 5, 2],
        [2, 6, 3, 4],
        [1, 7, 1],
        [2, 7, 5],
    ]
    for sequence in sequences:
        for stop in ((), ("zz",), ("z\ufffd",)):
            reply = ReplyText(pieces.__getitem__, stop)
            released = [item for token in sequence for item in reply.push(token)] + reply.finish()
            expected = complete_characters(b"".join(pieces[t] for t in sequence))
            for s in stop:
                expected = expected.split(s)[0]
            assert reply.text == "".join(item.text for item in released) == expected, (sequence, stop)
            assert len(released) == len(sequence) or reply.stopped
    # a broken byte in the middle is shown as such; only an unfinished character at the end is left out
    assert complete_characters(b"a\xffb\xe3\x83") == "a\ufffdb"


def test_cancel_stops_within_one_step() -> None:
    target, draft = pair()
    decoder = speculative_decoder(target, target, ModelDrafter(draft))
    cancel = threading.Event()
    steps = 0
    for event in decoder.stream([0], SamplingParams(temperature=0.8), GenerationOptions(max_tokens=200), cancel):
        if isinstance(event, StepEvent):
            steps += 1
            if steps == 2:
                cancel.set()
        if isinstance(event, GenerationResult):
            result = event
    assert result.stop_reason == "cancelled" and result.stats.steps == 2


# ---------------------------------------------------------------------------
# caches
# ---------------------------------------------------------------------------
def test_target_cache_holds_committed_tokens_minus_the_last_after_every_step() -> None:
    target, draft = pair()
    decoder = speculative_decoder(target, target, ModelDrafter(draft))
    context = [0, 1]
    for event in decoder.stream(
        list(context), SamplingParams(temperature=0.8), GenerationOptions(max_tokens=30, draft_tokens=4)
    ):
        if isinstance(event, TokenEvent):
            context.append(event.token_id)
        elif isinstance(event, StepEvent):
            # the step's tokens are committed before its event; rejected drafts are gone from the cache
            assert list(target.cached_tokens) == context[:-1]
    assert list(target.cached_tokens) == context[:-1]


@pytest.mark.parametrize("mode, temperature", [("greedy", 0.0), ("rejection", 0.8), ("invariant", 0.8)])
def test_second_turn_evaluates_only_new_tokens(mode: str, temperature: float) -> None:
    """KV reuse across turns, also after sampling turns whose rejected drafts were rolled back in both caches:
    the second turn evaluates only its new tokens and samples exactly what a fresh decoder would (same seed,
    fixed K; the toy's logits depend on the prefix alone, so any stale cache entry would change them)."""
    params = SamplingParams(temperature=temperature)
    target, draft = pair()
    decoder = speculative_decoder(target, target, ModelDrafter(draft))
    first_prompt = [0, 1, 2, 3]
    first = run(decoder, first_prompt, params, mode=mode, max_tokens=10, seed=3, adaptive=False)
    second_prompt = first_prompt + first.token_ids + [4, 5]
    second = run(decoder, second_prompt, params, mode=mode, max_tokens=10, seed=4, adaptive=False)
    # the cache held prompt + reply minus its last token; only that token and the 2 new ones (minus the
    # pending last) are evaluated before the first step
    assert second.stats.n_prompt_evaluated == 2
    fresh_target, fresh_draft = pair()
    fresh = run(speculative_decoder(fresh_target, fresh_target, ModelDrafter(fresh_draft)), second_prompt,
                params, mode=mode, max_tokens=10, seed=4, adaptive=False)  # fmt: skip
    assert fresh.token_ids == second.token_ids
    assert fresh.stats.n_prompt_evaluated == len(second_prompt) - 1
    if mode != "greedy":
        assert first.stats.accepted < first.stats.drafted or second.stats.accepted < second.stats.drafted, "no rollback"


def test_draft_catches_up_on_its_unevaluated_last_proposal() -> None:
    target, draft = pair(noise=0.01)  # near-perfect draft: most steps accept all K
    decoder = speculative_decoder(target, target, ModelDrafter(draft))
    result = run(decoder, [0], SamplingParams(temperature=0.0), mode="greedy", max_tokens=30, draft_tokens=3)
    assert result.stats.accepted == result.stats.drafted  # every draft accepted
    # before the next step the draft cache must extend the committed text exactly
    committed = [0] + result.token_ids
    assert list(draft.cached_tokens) == committed[: len(draft.cached_tokens)]


def test_smaller_draft_vocabulary_works_end_to_end() -> None:
    target, draft = pair(draft_vocab=V - 2)
    decoder = speculative_decoder(target, target, ModelDrafter(draft))
    assert decoder.vocab_size == V
    result = run(decoder, [0], max_tokens=50, seed=3)
    assert len(result.token_ids) == 50 and result.stats.accepted > 0


def test_detail_records_top_entries_for_every_reached_row() -> None:
    target, draft = pair()
    decoder = speculative_decoder(target, target, ModelDrafter(draft))
    options = GenerationOptions(max_tokens=20, detail_top=3)
    events = list(with_position_records(decoder.stream([0], SamplingParams(temperature=0.8), options), decoder, 3))
    for step in (e for e in events if isinstance(e, StepEvent)):
        for row in step.rows:
            if row.outcome in ("accepted", "rejected", "bonus"):
                assert len(row.top_p) == 3
                assert [e.prob for e in row.top_p] == sorted((e.prob for e in row.top_p), reverse=True)
            if row.outcome in ("accepted", "rejected"):
                assert len(row.top_q) == 3 and row.p is not None and row.q is not None


def test_ngram_drafter_copies_the_latest_match() -> None:
    ngram = NgramDrafter(ToyLM(10, seed=0))
    mode = RejectionMode(SamplingParams(), np.random.default_rng(0), 10)
    assert ngram.propose([1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3], 3, mode).tokens == [7, 1, 2]
    assert ngram.propose([5, 6], 3, mode).tokens == []
    assert ngram.propose([4, 4, 4], 2, mode).tokens == [4]
    assert ngram.propose([1, 2, 1], 4, mode).tokens == [2, 1]
