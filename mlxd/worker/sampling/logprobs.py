"""Log probabilities of sampled tokens, computed inside the batched step for the rows that ask.

We report the model's own distribution: the log-softmax of the raw logits, before penalties,
logit bias, temperature, top-k/p filters and grammar masks (as OpenAI does, and vLLM by default).
So a greedy token is always the best entry of its ``top_logprobs``, and a request's logprobs do
not change with its sampling settings. Rows that do not ask cost nothing: the step gathers only
the asking rows' logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from mlxd.worker.sched.sequence import Sequence

# (token id, its logprob, [(alternative id, its logprob), ...] best first), kept on the Sequence
# until the engine sends it.
RawLogprob = tuple[int, float, list[tuple[int, float]]]


@dataclass(frozen=True, slots=True)
class StepLogprobs:
    """Lazy arrays for the rows of one step that asked for logprobs, in ``seqs`` order."""

    seqs: list[Sequence]
    chosen: mx.array  # (n,) logprob of the sampled token
    top_ids: mx.array  # (n, k) best first; k is the largest top_logprobs of these rows
    top_values: mx.array  # (n, k)

    def arrays(self) -> list[mx.array]:
        return [self.chosen, self.top_ids, self.top_values]

    def attach(self, tokens: dict[Sequence, int]) -> None:
        """Append each row's entry to ``seq.logprobs`` for the rows whose token is in ``tokens``
        (the ones read back now)."""
        wanted = [(i, s) for i, s in enumerate(self.seqs) if s in tokens]
        if not wanted:
            return
        chosen: list[float] = self.chosen.tolist()  # type: ignore[assignment]
        ids: list[list[int]] = self.top_ids.tolist()  # type: ignore[assignment]
        values: list[list[float]] = self.top_values.tolist()  # type: ignore[assignment]
        for i, seq in wanted:
            k = seq.sampling.top_logprobs
            top = list(zip(ids[i][:k], values[i][:k], strict=True))
            seq.logprobs.append((tokens[seq], chosen[i], top))


def attach_positions(
    lp: StepLogprobs | None, seqs: list[Sequence], picks: list[tuple[int, int]]
) -> None:
    """Entries for a verification's kept positions: ``picks`` are (index into ``seqs``, the
    token there), in output order; ``lp`` was computed over ``seqs`` (a row once per position)."""
    if lp is None:
        return
    asking = {i: n for n, i in enumerate(i for i, s in enumerate(seqs) if s.sampling.logprobs)}
    chosen: list[float] = lp.chosen.tolist()  # type: ignore[assignment]
    ids: list[list[int]] = lp.top_ids.tolist()  # type: ignore[assignment]
    values: list[list[float]] = lp.top_values.tolist()  # type: ignore[assignment]
    for i, token in picks:
        if i in asking:
            n, k = asking[i], seqs[i].sampling.top_logprobs
            seqs[i].logprobs.append(
                (token, chosen[n], list(zip(ids[n][:k], values[n][:k], strict=True)))
            )


def compute(logits: mx.array, tokens: mx.array, seqs: list[Sequence]) -> StepLogprobs | None:
    """Logprobs of ``tokens`` (B,) under ``logits`` (B, V) for the rows of ``seqs`` that ask;
    ``None`` (and no work) when none does."""
    rows = [i for i, s in enumerate(seqs) if s.sampling.logprobs]
    if not rows:
        return None
    idx = mx.array(rows)
    sub = logits[idx].astype(mx.float32)
    lp = sub - mx.logsumexp(sub, axis=-1, keepdims=True)
    chosen = mx.take_along_axis(lp, tokens[idx].astype(mx.int32)[:, None], axis=-1)[:, 0]
    k = max(seqs[i].sampling.top_logprobs for i in rows)
    if k == 0:
        empty = mx.zeros((len(rows), 0))
        return StepLogprobs([seqs[i] for i in rows], chosen, empty.astype(mx.int32), empty)
    k = min(k, lp.shape[-1])
    part = mx.argpartition(-lp, kth=k - 1, axis=-1)[:, :k]
    part_values = mx.take_along_axis(lp, part, axis=-1)
    order = mx.argsort(-part_values, axis=-1)
    top_ids = mx.take_along_axis(part, order, axis=-1)
    top_values = mx.take_along_axis(part_values, order, axis=-1)
    return StepLogprobs([seqs[i] for i in rows], chosen, top_ids, top_values)
