"""Prompt-lookup drafts, per-row draft lengths, and the batch controller that speculates only
while verification pays (issue #20 points 1-2). Pure Python: a fake clock stands for the
device."""

from __future__ import annotations

import random

import pytest

from mlxd.protocol.messages import SamplingParams
from mlxd.worker.kv import attention_shapes
from mlxd.worker.sched.sequence import Sequence
from mlxd.worker.spec.ngram import NgramIndex
from mlxd.worker.spec.speculator import FIRST_DRAFT, MAX_DRAFT, PHASE, Speculator, _kept, resolve


def _seq(prompt: list[int], **sampling: object) -> Sequence:
    return Sequence(
        request_id="r",
        client=b"c",
        prompt_ids=prompt,
        max_tokens=100,
        sampling=SamplingParams(**sampling),
    )  # type: ignore[arg-type]


def test_ngram_proposes_what_followed_the_last_occurrence() -> None:
    index = NgramIndex()
    index.sync([1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 1, 2], [])
    assert index.propose(3) == [3, 7, 8]  # the last "1 2" was followed by 3 7 8
    index.sync([1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 1, 2], [3, 4])  # output extends it
    assert index.propose(2) == [5, 9]  # "2 3 4" occurred once before, followed by 5 9
    assert NgramIndex().propose(4) == []
    lone = NgramIndex()
    lone.sync([5, 6, 7], [])
    assert lone.propose(4) == []  # 7 never occurred before
    loop = NgramIndex()
    loop.sync([4, 1, 2, 3, 1, 2], [])
    assert loop.propose(5) == [3, 1, 2, 3, 1]  # "1 2" three tokens back: period 3


def test_the_longest_ngram_decides() -> None:
    index = NgramIndex()
    # "3" alone last occurred before 9; "2 3" last occurred before 4.
    index.sync([2, 3, 4, 0, 3, 9, 2, 3], [])
    assert index.propose(1) == [4]


def test_draft_length_follows_acceptance() -> None:
    spec = Speculator("ngram")
    seq = _seq([1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2])
    assert len(spec.propose([seq])[0]) == FIRST_DRAFT == 4
    spec.on_verified([seq], [[3, 1, 2, 3]], [5])  # all accepted: longer
    longer = len(spec.propose([seq])[0])
    assert FIRST_DRAFT < longer < MAX_DRAFT
    spec.on_verified([seq], [[3] * longer], [longer + 1])  # again: as long as a draft may be
    assert len(spec.propose([seq])[0]) == MAX_DRAFT
    spec.on_verified([seq], [[3] * 8], [3])  # two of eight: shorter, not back to nothing
    assert 2 < len(spec.propose([seq])[0]) < MAX_DRAFT
    for _ in range(6):
        spec.on_verified([seq], [[3] * 4], [1])  # the first draft keeps failing
    assert len(spec.propose([seq])[0]) == 1
    assert spec.counters.drafted == 36 + longer and spec.counters.accepted == 6 + longer


def test_tokens_per_forward_counts_every_decode_row() -> None:
    spec = Speculator("ngram")
    spec.on_verified([_seq([1]), _seq([1])], [[5, 6], []], [3, 1])  # 2 rows, 2 accepted
    spec.on_step(True, 2, clean=True)
    spec.on_step(True, 2, clean=True)  # speculating, but nobody had drafts: plain rows
    spec.on_step(False, 2, clean=True)
    assert spec.counters.tokens_per_forward == (6 + 2) / 6


def test_rows_that_may_not_draft() -> None:
    spec = Speculator("ngram")
    prompt = [1, 2, 1, 2, 1, 2]
    assert spec.propose([_seq(prompt, speculate=False)]) == [[]]
    assert spec.propose([_seq(prompt, repetition_penalty=1.2)]) == [[]]  # needs exact history
    assert not spec.wants([_seq(prompt, speculate=False)])
    assert not Speculator("off").wants([_seq(prompt)])
    short = _seq(prompt)
    short.max_tokens = 2
    assert len(spec.propose([short])[0]) == 1  # room for its last token only after the drafts


def _verify(
    spec: Speculator, seqs: list[Sequence], tokens_per_row: float, rng: random.Random
) -> int:
    """A verification of ``seqs``' drafts where each row makes ``tokens_per_row`` tokens on
    average (as far as its draft allows); returns the tokens made."""
    drafts = spec.propose(seqs)
    whole, part = divmod(tokens_per_row, 1.0)
    kept = [min(len(d) + 1, int(whole) + (rng.random() < part)) for d in drafts]
    spec.on_verified(seqs, drafts, kept)
    return sum(kept)


class _Device:
    """A fake device: a plain step of ``rows`` costs ``plain_s``; a verification costs
    ``verify_s`` and yields ``tokens_per_row`` tokens per row."""

    def __init__(
        self, plain_s: float, verify_s: float, tokens_per_row: float, switch_s: float = 0.0
    ) -> None:
        """``switch_s``: what a verification right after a plain step costs on top (a draft
        model catching up with its rows)."""
        self.now = 0.0
        self.plain_s, self.verify_s, self.tokens_per_row = plain_s, verify_s, tokens_per_row
        self.switch_s = switch_s
        self.rng = random.Random(0)
        self.last = False

    def run(self, spec: Speculator, rows: int, steps: int) -> tuple[float, float]:
        """Tokens per second over ``steps`` steps, and the share of verification steps."""
        seqs = [_seq([1, 2, 1, 2, 1, 2, 1, 2, 1, 2]) for _ in range(rows)]
        tokens, verifying, start = 0.0, 0, self.now
        for _ in range(steps):
            speculate = spec.wants(seqs)
            made = _verify(spec, seqs, self.tokens_per_row, self.rng) if speculate else rows
            self.now += self.verify_s if speculate else self.plain_s
            self.now += self.switch_s if speculate and not self.last else 0.0
            self.last = speculate
            spec.on_step(speculate, rows, clean=True)
            tokens += made
            verifying += speculate
        return tokens / (self.now - start), verifying / steps


@pytest.mark.parametrize(
    ("plain_s", "verify_s", "tokens_per_row", "want_spec"),
    [
        (0.010, 0.012, 2.5, True),  # one stream copying code: verification pays
        (0.010, 0.016, 1.1, False),  # 64 streams of chat: it does not
        (0.010, 0.011, 1.05, False),
    ],  # nearly even, still a loss
)
def test_the_controller_runs_the_faster_mode(
    plain_s: float, verify_s: float, tokens_per_row: float, want_spec: bool
) -> None:
    device = _Device(plain_s, verify_s, tokens_per_row)
    spec = Speculator("ngram", clock=lambda: device.now)
    device.run(spec, 64, 200)  # learning
    tps, share = device.run(spec, 64, 4000)
    best = 64 * max(1.0 / plain_s, tokens_per_row / verify_s)
    assert tps >= 0.97 * best  # the losing mode costs at most a few percent
    assert (share > 0.5) == want_spec


@pytest.mark.parametrize("rows", [1, 64])
def test_a_dear_mode_that_loses_costs_a_few_percent(rows: int) -> None:
    """A draft model whose drafts are rejected: its verification step costs 8x a plain one
    for 1.05 tokens a row (run D2 on an H100: 0.40-0.76x when tries ran at a plain step's
    pace). From the start, learning included, the controller keeps 95 % of plain steps'
    throughput, and 97 % once it has learnt."""
    device = _Device(0.010, 0.080, 1.05)
    spec = Speculator("ngram", clock=lambda: device.now)
    plain = rows / 0.010
    tps, _ = device.run(spec, rows, 3000)
    assert tps >= 0.95 * plain
    tps, share = device.run(spec, rows, 6000)
    assert tps >= 0.97 * plain
    assert share < 0.01


def test_a_try_that_begins_dear_comes_rarely() -> None:
    """A draft model at 64 streams whose drafts are rejected: its first verification after
    plain steps feeds the draft every new row's prompt (3 s here; run D3 on an H100: 0.32x
    with tries at a plain phase's pace). Counting that first step in a try's cost keeps the
    controller at 90 % of plain steps' throughput from the start, 97 % once it has learnt."""
    device = _Device(0.030, 0.080, 1.05, switch_s=3.0)
    spec = Speculator("ngram", clock=lambda: device.now)
    plain = 64 / 0.030
    tps, _ = device.run(spec, 64, 3000)
    assert tps >= 0.9 * plain
    tps, _ = device.run(spec, 64, 6000)
    assert tps >= 0.97 * plain


def test_a_draining_batch_loses_little_where_verification_never_pays() -> None:
    """64 requests of 100-256 tokens end one by one: the batch passes through every size
    class down to one row. Verification costs 3.2x a plain step for 2.8 tokens a row, and a
    plain step after verifying rebuilds decode's view (30 ms). Learning each class afresh and
    trying verification every few phases cost 0.87x (the H100's 0.74-0.90x at 64 streams)."""
    rng = random.Random(0)
    left = [rng.randint(100, 256) for _ in range(64)]
    seqs = [_seq([1, 2, 1, 2, 1, 2, 1, 2, 1, 2]) for _ in range(64)]
    now, plain_only, last = 0.0, 0.0, False
    spec = Speculator("ngram", clock=lambda: now)
    while left:
        n = len(left)
        plain = 0.008 + 0.00015 * n
        speculate = spec.wants(seqs[:n])
        now += plain * 3.2 if speculate else plain + (0.03 if last else 0.0)
        made = _verify(spec, seqs[:n], 2.8, rng) if speculate else n
        per_row = made / n
        spec.on_step(speculate, n, clean=True)
        plain_only += plain * per_row  # the same tokens without speculation
        last = speculate
        left = [k - per_row for k in left if k > per_row]
    assert plain_only / now >= 0.95


def test_the_controller_follows_a_change() -> None:
    """Acceptance collapses (the rows stop copying): the controller leaves speculation."""
    device = _Device(0.010, 0.012, 2.5)
    spec = Speculator("ngram", clock=lambda: device.now)
    device.run(spec, 8, 400)
    device.tokens_per_row = 1.0
    tps, share = device.run(spec, 8, 2000)
    assert share < 0.15


def test_the_controller_tries_speculation_again() -> None:
    """Rows that did not copy are replaced by rows that do: plain steps know nothing of it, so
    only a periodic try of speculation finds out."""
    device = _Device(0.010, 0.012, 1.0)
    spec = Speculator("ngram", clock=lambda: device.now)
    _, share = device.run(spec, 8, 2000)
    assert share < 0.1
    device.tokens_per_row = 2.5
    _, share = device.run(spec, 8, 3000)
    assert share > 0.8


def _write(
    spec: Speculator, seq: Sequence, text: list[int], clock: list[float], cost: float = 2.9
) -> float:
    """Row ``seq`` writes ``text`` (a verification keeps the drafts ``text`` agrees with and
    costs ``cost`` plain steps: 2.9 on an H200 at one stream, run T3); returns the share of the text
    that verifications made."""
    verified = pos = 0
    while pos < len(text):
        speculate = spec.wants([seq])
        draft = spec.propose([seq])[0][: len(text) - pos - 1] if speculate else []
        made = 1
        if draft:  # as the engine: a verification only where some row has a draft
            made = _kept(draft, text[pos : pos + len(draft) + 1]) or len(draft) + 1
            spec.on_verified([seq], [draft], [made])
        seq.output_ids += text[pos : pos + made]
        pos += made
        clock[0] += 0.001 * (cost if draft else 1.0)
        spec.on_step(speculate, 1, clean=True)
        verified += made if draft else 0
    return verified / len(text)


def test_one_stream_verifies_while_it_copies() -> None:
    """One stream copies its prompt, then writes new text, then copies again. Verification
    pays while it copies (drafts kept) and not in between. Plain steps still score prompt
    lookup's drafts against the tokens that follow (unverified), so the second copy is seen
    within a few phases; judged only by tries of verification, whose wait doubles after each
    that lost (to 32 phases, 256 steps, over the new text), most of it ran plain."""
    rng = random.Random(3)
    prompt = [rng.randrange(1000) for _ in range(600)]
    seq = _seq(prompt)
    seq.max_tokens = 5000
    clock = [0.0]
    spec = Speculator("ngram", clock=lambda: clock[0])
    assert _write(spec, seq, prompt[:300], clock) > 0.8
    assert _write(spec, seq, [rng.randrange(1000, 2000) for _ in range(2000)], clock) < 0.2
    assert _write(spec, seq, prompt[300:], clock) > 0.8


def test_a_new_row_is_expected_to_make_what_the_rows_before_it_made() -> None:
    """One stream of chat, request after request: drafts are rejected. A new request is
    expected to make what the earlier ones made in their verifications, so it does not start
    by verifying (with a fixed guess of 2.4 tokens, each began with a phase of them where a
    verification costs 2x a plain step)."""
    rng = random.Random(4)
    clock = [0.0]
    spec = Speculator("ngram", clock=lambda: clock[0])
    shares = []
    for _ in range(12):
        seq = _seq([rng.randrange(1000) for _ in range(50)])
        seq.max_tokens = 1000
        shares.append(
            _write(spec, seq, [rng.randrange(1000, 2000) for _ in range(60)], clock, cost=2.0)
        )
    assert sum(shares[4:]) / 8 < 0.05  # tries aside (a phase in 32)


def test_a_verification_phase_step_with_no_draft_is_not_timed_as_a_verification() -> None:
    """Prompt lookup finds nothing: the engine runs a plain step in a verification phase. Its
    time is not a verification's (that would make verifying look as cheap as a plain step),
    and the row learns that a verification would have made 1 token."""
    clock = [0.0]
    spec = Speculator("ngram", clock=lambda: clock[0])
    seq = _seq(list(range(50)))  # no token repeats: nothing to look up
    for _ in range(2 * PHASE):
        speculate = spec.wants([seq])
        assert not any(spec.propose([seq])) if speculate else True
        seq.output_ids.append(100 + len(seq.output_ids))
        clock[0] += 0.001
        spec.on_step(speculate, 1, clean=True)
    assert True not in spec._estimates[1].step_s
    assert spec.expected(seq) < 1.5


def test_steps_stay_pipelined_while_no_row_has_a_draft() -> None:
    """One stream writes text that prompt lookup never continues: after one verification step
    that found no draft, steps of a verification phase run plain without reading the last
    token first (``wants`` is False), until an unverified draft shows up; then it verifies."""
    clock = [0.0]
    spec = Speculator("ngram", clock=lambda: clock[0])
    seq = _seq(list(range(50)))
    seq.max_tokens = 1000
    asked = 0
    for _ in range(200):
        speculate = spec.wants([seq])
        asked += speculate
        if speculate:
            assert not any(spec.propose([seq]))
        seq.output_ids.append(1000 + len(seq.output_ids))  # never seen before
        clock[0] += 0.001
        spec.on_step(speculate, 1, clean=True)
    assert asked <= 2
    seq.output_ids += list(range(10))  # now it copies its prompt: drafts again
    assert any(spec.wants([seq]) for _ in range(3 * PHASE))


def test_auto_is_prompt_lookup_except_where_attention_builds_plans(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(attention_shapes, "PLANNED", False)
    assert [resolve(m) for m in ("auto", "ngram", "off")] == ["ngram", "ngram", "off"]
    monkeypatch.setattr(attention_shapes, "PLANNED", True)  # CUDA
    assert [resolve(m) for m in ("auto", "ngram", "off")] == ["off", "ngram", "off"]
