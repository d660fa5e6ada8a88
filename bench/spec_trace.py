"""Where speculation's time goes at many streams (issue #20): the engine in-process (no HTTP) on
a scenario's prompts (``edit``, ``json``, ``chat``, chat-templated), speculation ``off``,
``ngram`` with the batch controller, and ``forced`` (every step with a draft verifies),
alternated. Prints per mode the tokens per second, and per batch-size class the steps of each
kind with their mean wall time and tokens, and the controller's phase estimates.

    python bench/spec_trace.py --model DIR [--scenario edit] [--streams 64] [--repeats 2] \
        [--stagger] [--modes off,ngram,forced] [--profile MODE] [--windows]

A mode ending in ``/gather`` runs with ``runners.paged.VIEW_VERIFY`` off: a lone row verifies
over its gathered blocks instead of decode's view (``forced,forced/gather`` compares the two).
Each mode's outputs are compared with the first mode's (``same n/N``); ``--margins`` also asks
for every token's top-2 log probabilities and prints the first mode's margin where an output
parts (a near-tie's is small).
``--stagger``: request ``i`` of ``n`` asks for ``max_tokens * (0.5 + i / n)`` tokens, so rows
leave the batch one by one, as in served traffic, not all at the last step. ``--profile MODE``:
that mode's last run under cProfile (top functions by own time).
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import io
import os
import pstats
import time
from typing import Any

from mlxd.worker import blas

blas.preload(os.environ)  # as a worker does, before MLX loads (the CPU's optimized BLAS)

from mlxd.bench import tasks  # noqa: E402
from mlxd.bench.engine import engine_level, load_served, new_engine  # noqa: E402
from mlxd.config import SchedulerConfig  # noqa: E402
from mlxd.worker.runners import paged as paged_runner  # noqa: E402
from mlxd.worker.spec import speculator as spec_mod  # noqa: E402

_TASKS = {"edit": tasks.edit_prompt, "json": tasks.json_prompt, "chat": tasks.chat_prompt}


def prompts(tokenizer: Any, scenario: str, n: int) -> list[list[int]]:
    out = []
    for i in range(n):
        text = _TASKS[scenario](i)
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True
        )
        out.append(list(ids))
    return out


class Trace:
    """Wraps the engine's speculator: each step's kind, rows, tokens and wall time."""

    def __init__(self, engine: Any) -> None:
        self.steps: list[tuple[bool, int, int, float, bool]] = []
        self.phases: list[tuple[int, bool, float, bool]] = []
        sp = engine.speculator
        orig_on_step, orig_end = sp.on_step, sp._end_phase
        last = [time.perf_counter(), sp.counters.accepted]

        def on_step(speculated: bool, rows: int, clean: bool) -> None:
            now, accepted = time.perf_counter(), sp.counters.accepted
            tokens = rows + accepted - last[1]  # each row's token and its accepted drafts
            self.steps.append((speculated, rows, tokens, now - last[0], clean))
            last[:] = [now, accepted]
            orig_on_step(speculated, rows, clean)

        def end_phase() -> None:
            if sp._phase_mode is not None and sp._phase_seconds > 0:
                est = sp._estimates.get(sp._phase_class, spec_mod._Estimate())
                step_ms = 1000 * sp._phase_seconds / max(1, sp._phase_counted)
                self.phases.append((sp._phase_class, sp._phase_mode, step_ms, est.trying))
            orig_end()

        sp.on_step, sp._end_phase = on_step, end_phase

    def report(self, label: str) -> None:
        by: dict[tuple[int, bool], list[tuple[int, float]]] = collections.defaultdict(list)
        for speculated, rows, tokens, dt, clean in self.steps[1:]:
            if clean:
                by[(rows.bit_length(), speculated)].append((tokens / rows, dt))
        for (cls, sp), xs in sorted(by.items(), reverse=True):
            n = len(xs)
            print(
                f"  {label:7s} class {cls} ({2 ** (cls - 1)}+ rows) {'verify' if sp else 'plain '}"
                f" steps {n:4d}  ms/step {1000 * sum(d for _, d in xs) / n:6.2f}"
                f"  tok/row/step {sum(t for t, _ in xs) / n:5.2f}"
            )
        est = collections.Counter((c, m) for c, m, _, _ in self.phases)
        print(f"  {label:7s} phases (class, verify?): {dict(sorted(est.items(), reverse=True))}")
        for c, m, step_ms, trying in self.phases[:12]:
            print(
                f"    phase class {c} {'verify' if m else 'plain '} {step_ms:6.2f} ms/step"
                f"{' (try)' if trying else ''}"
            )


def _same(
    outputs: dict[str, dict[str, list[int]]], mode: str, margins: dict[str, list[float]]
) -> str:
    """How many of ``mode``'s outputs are the first mode's, token for token (greedy: all, up to
    near-ties that a wider forward's arithmetic decides otherwise), and where the others part;
    with ``--margins``, the first mode's top-2 log-probability margin there (a near-tie: small)."""
    first, mine = next(iter(outputs.values())), outputs[mode]
    parted = [(k, _part(v, mine.get(k, []))) for k, v in first.items() if mine.get(k) != v]
    where = [
        f"{i} ({margins[k][i]:.4f})" if i < len(margins.get(k, [])) else str(i) for k, i in parted
    ]
    same = len(first) - len(parted)
    return f"same {same}/{len(first)}" + (f" (part at {', '.join(where)})" if parted else "")


def _part(a: list[int], b: list[int]) -> int:
    """The first index where ``a`` and ``b`` differ (or the shorter one's length)."""
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def _paths(mode: str) -> None:
    """The verification path a mode names (``/gather``: the module doc)."""
    paged_runner.VIEW_VERIFY = not mode.endswith("/gather")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--scenario", default="edit", choices=sorted(_TASKS))
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--kv-cache-gb", type=float, default=8.0)
    ap.add_argument("--stagger", action="store_true")
    ap.add_argument("--modes", default="off,ngram,forced")
    ap.add_argument("--profile", default="")
    ap.add_argument("--max-draft", type=int, default=spec_mod.MAX_DRAFT)
    ap.add_argument("--worth", type=float, default=spec_mod.WORTH)
    ap.add_argument(
        "--margins",
        action="store_true",
        help="ask for top-2 log probabilities: where outputs part, print the first "
        "mode's margin there (slower steps: not for timing)",
    )
    ap.add_argument(
        "--windows",
        action="store_true",
        help="verify in one multi-query window per row (paged_runner.VIRTUAL_ROWS off)",
    )
    args = ap.parse_args()
    if args.windows:
        paged_runner.VIRTUAL_ROWS = False
    spec_mod.MAX_DRAFT, spec_mod.WORTH = args.max_draft, args.worth
    n = args.streams
    budget: int | list[int] = (
        [int(args.max_tokens * (0.5 + i / n)) for i in range(n)]
        if args.stagger
        else args.max_tokens
    )
    model, tokenizer = load_served(args.model)
    ps = prompts(tokenizer, args.scenario, args.streams)
    engines = {}
    for mode in args.modes.split(","):
        _paths(mode)
        sched = SchedulerConfig(
            max_num_seqs=max(args.streams, 1), speculate="off" if mode == "off" else "ngram"
        )
        e = new_engine(model, tokenizer, sched, 4096, kv_cache_gb=args.kv_cache_gb)
        e.speculator.adaptive = not mode.startswith("forced")
        engine_level(e, ps[:2], 16)  # warm-up
        engines[mode] = e
    outputs: dict[str, dict[str, list[int]]] = {}
    margins: dict[str, list[float]] = {}  # the first mode's, per request and token
    for rep in range(args.repeats):
        for mode, e in engines.items():
            _paths(mode)
            trace = Trace(e)
            prof = cProfile.Profile() if mode == args.profile and rep == args.repeats - 1 else None
            if prof:
                prof.enable()
            r = engine_level(e, ps, budget, margins=args.margins)
            if prof:
                prof.disable()
            outputs[mode] = e.channel.tokens
            if mode == next(iter(engines)):
                margins = e.channel.margins
            print(
                f"rep {rep} {mode:7s} {r['output_tok_s']:8.0f} tok/s  step p50 "
                f"{r['step_p50_ms']} ms  accept {r['spec_acceptance']}  tok/fwd "
                f"{r['tokens_per_forward']}  ttft p50 {r['ttft_p50_ms']:.0f} ms  "
                f"{_same(outputs, mode, margins)}"
            )
            trace.report(mode)
            if prof:
                out = io.StringIO()
                pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(22)
                print("\n".join(out.getvalue().splitlines()[6:]))


if __name__ == "__main__":
    main()
