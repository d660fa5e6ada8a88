"""What a benchmark sends: requests, conversations (sessions) and the scenarios that build them.

Prompts are token ids of an exact length; ``as_text`` turns them into text for chat or for
servers that take only strings. A scenario is a list of phases; each phase is measured at every
concurrency level and gives its own rows (e.g. shared-prefix: cold, then hit, per prefix length).
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mlxd.bench import tasks
from mlxd.bench.images import png_data_url
from mlxd.bench.stats import ALL

SCENARIOS = (
    "throughput",
    "shared-prefix",
    "multi-turn",
    "mixed",
    "multi-model",
    "priority-mix",
    "edit",
    "json",
    "chat",
    "shared-image",
)
# Scenarios of natural text (bench/tasks.py): each request ends where the model stops.
_TASKS: dict[str, Callable[[int], str]] = {
    "edit": tasks.edit_prompt,
    "json": tasks.json_prompt,
    "chat": tasks.chat_prompt,
}
Prompt = list[int] | str
# Common English words, about one token each in any BPE vocabulary: the fallback text for chat
# when no tokenizer is given (lengths are then approximate).
_WORDS = (
    "the of and to in is was for on are with as by at be this from or have an they which one "
    "you were her all she there would their we him been has when who will more no if out so "
    "said what up its about into than them can only other new some could time these two may "
    "then do first any my now such like our over man me even most made after also did many "
    "before must through back years where much your way well down should because each just "
    "those people how too little state good very make world still own see men work long get "
    "here between both life being under never day same another know while last might us great "
    "old year off come since against go came right used take three"
).split()


@dataclass
class Request:
    """One request: an optional shared prefix (the system prompt), the user's part, a model."""

    user: Prompt
    max_tokens: int
    model: str
    prefix: Prompt | None = None
    group: str = ALL
    headers: dict[str, str] = field(default_factory=dict)
    ignore_eos: bool = True  # run max_tokens whatever the model says (not for natural tasks)
    image: str | None = None  # a data URL sent before the user's text (chat only)


@dataclass
class Session:
    """Requests sent one after another by one client. With ``carry_history`` each turn also
    sends the earlier turns and their replies (a chat that grows turn by turn)."""

    turns: list[Request]
    carry_history: bool = False


@dataclass(frozen=True)
class WorkloadOptions:
    """The command-line shape of a workload."""

    models: tuple[str, ...]
    prompt_tokens: int = 128
    max_tokens: int = 256
    requests_per_level: int = 0
    prefix_tokens: tuple[int, ...] = (500, 2000, 8000)
    turns: int = 4
    mixed_lengths: tuple[int, ...] = (32, 128, 512, 2048)
    high_fraction: float = 0.25
    image_size: int = 0  # each request's image is this many pixels a side (0: no image)

    def num_sessions(self, level: int) -> int:
        # Every model gets a request at every level, so each has its own row even at level 1.
        return max(level, self.requests_per_level, len(self.models))


@dataclass
class Phase:
    """One measured part of a scenario. ``make(seed)`` builds a level's sessions (a new seed for
    every warm-up and run, so nothing is cached by accident); ``prime`` is sent once, unmeasured,
    before the runs (it puts the shared prefix in the server's cache)."""

    tags: dict[str, Any]
    make: Callable[[int, int], list[Session]]  # (level, seed) -> sessions
    prime: Session | None = None
    name: str = ""  # for progress lines, e.g. "prefix 500 cold"


def make_prompts(n: int, prompt_tokens: int, vocab: int = 1000, seed: int = 0) -> list[list[int]]:
    """Token-id prompts of an exact length (ids kept low so every vocabulary has them)."""
    rng = random.Random(seed)
    return [[rng.randrange(10, vocab) for _ in range(prompt_tokens)] for _ in range(n)]


def words(ids: list[int]) -> str:
    """``ids`` as common words, about one token each: text for chat without a tokenizer."""
    return " ".join(_WORDS[i % len(_WORDS)] for i in ids)


def phases(scenario: str, opts: WorkloadOptions) -> list[Phase]:
    """The phases of ``scenario`` (one of ``SCENARIOS``)."""
    if scenario == "shared-prefix":
        return [p for n in opts.prefix_tokens for p in _prefix_phases(opts, n)]
    if scenario == "shared-image":
        return _image_phases(opts)
    if scenario in _TASKS:
        return [Phase(tags={}, make=lambda level, seed: _tasks(opts, level, seed, scenario))]
    builders: dict[str, Callable[[int, int], list[Session]]] = {
        "throughput": lambda level, seed: _singles(opts, level, seed, opts.prompt_tokens),
        "multi-model": lambda level, seed: _singles(opts, level, seed, opts.prompt_tokens),
        "mixed": lambda level, seed: _mixed(opts, level, seed),
        "multi-turn": lambda level, seed: _conversations(opts, level, seed),
        "priority-mix": lambda level, seed: _priority_mix(opts, level, seed),
    }
    return [Phase(tags={}, make=builders[scenario])]


# Internal helpers


def _request(opts: WorkloadOptions, i: int, user: Prompt, group: str | None = None) -> Request:
    # Several models: requests go round-robin and each model is its own group.
    model = opts.models[i % len(opts.models)]
    label = group or (model if len(opts.models) > 1 else ALL)
    req = Request(user=user, max_tokens=opts.max_tokens, model=model, group=label)
    if opts.image_size:  # an image of its own, drawn from its text: no two requests share one
        req.image = png_data_url(opts.image_size, zlib.crc32(repr(user).encode()))
    return req


def _singles(opts: WorkloadOptions, level: int, seed: int, length: int) -> list[Session]:
    prompts = make_prompts(opts.num_sessions(level), length, seed=seed)
    return [Session([_request(opts, i, p)]) for i, p in enumerate(prompts)]


def _tasks(opts: WorkloadOptions, level: int, seed: int, scenario: str) -> list[Session]:
    """One natural-text request per session (``edit``, ``json``, ``chat``), each its own text,
    ending where the model stops (at most ``max_tokens``)."""
    out = []
    for i in range(opts.num_sessions(level)):
        req = _request(opts, i, _TASKS[scenario](seed * 100_003 + i))  # its image from its text
        req.ignore_eos = False
        out.append(Session([req]))
    return out


def _mixed(opts: WorkloadOptions, level: int, seed: int) -> list[Session]:
    rng = random.Random(seed)
    out = []
    for i in range(opts.num_sessions(level)):
        n = opts.mixed_lengths[i % len(opts.mixed_lengths)]
        prompt = make_prompts(1, n, seed=rng.getrandbits(32))[0]
        out.append(Session([_request(opts, i, prompt, group=f"{n} tok")]))
    rng.shuffle(out)  # lengths interleave differently at every level
    return out


def _conversations(opts: WorkloadOptions, level: int, seed: int) -> list[Session]:
    out = []
    for i in range(opts.num_sessions(level)):
        users = make_prompts(opts.turns, opts.prompt_tokens, seed=seed * 1000 + i)
        turns = [_request(opts, i, u, group=f"turn {k + 1}") for k, u in enumerate(users)]
        out.append(Session(turns, carry_history=True))
    return out


def _priority_mix(opts: WorkloadOptions, level: int, seed: int) -> list[Session]:
    rng = random.Random(seed)
    sessions = _singles(opts, level, seed, opts.prompt_tokens)
    n_high = max(1, round(len(sessions) * opts.high_fraction))
    for k, session in enumerate(sessions):
        priority = "high" if k < n_high else "low"
        req = session.turns[0]
        req.group, req.headers = priority, {"X-Priority": priority}
    rng.shuffle(sessions)  # high-priority requests arrive among the low ones
    return sessions


def _prefix_phases(opts: WorkloadOptions, prefix_tokens: int) -> list[Phase]:
    """Cold: every request has its own prefix. Hit: one prefix, sent once first, then shared by
    every request (only the short user part differs)."""
    shared = make_prompts(1, prefix_tokens, seed=random.getrandbits(32))[0]
    suffix = max(8, opts.prompt_tokens)

    def cold(level: int, seed: int) -> list[Session]:
        n = opts.num_sessions(level)
        # A random draw, not the seed: a prefix cached by an earlier run must not hit.
        prefixes = make_prompts(n, prefix_tokens, seed=random.getrandbits(32))
        return [_with_prefix(opts, i, p, suffix, seed, "cold") for i, p in enumerate(prefixes)]

    def hit(level: int, seed: int) -> list[Session]:
        n = opts.num_sessions(level)
        return [_with_prefix(opts, i, shared, suffix, seed, "hit") for i in range(n)]

    tags = {"prefix_tokens": prefix_tokens}
    prime = _with_prefix(opts, 0, shared, suffix, -1, "hit")
    name = f"prefix {prefix_tokens}"
    return [Phase(tags, cold, name=f"{name} cold"), Phase(tags, hit, prime, f"{name} hit")]


def _image_phases(opts: WorkloadOptions) -> list[Phase]:
    """Cold: every request has its own image. Hit: one image, sent once first, then shared by
    every request (the text after it differs): TTFT with the image's tokens cached."""
    shared = png_data_url(opts.image_size, random.getrandbits(32))

    def cold(level: int, seed: int) -> list[Session]:
        prompts = make_prompts(opts.num_sessions(level), opts.prompt_tokens, seed=seed)
        return [Session([_request(opts, i, p, group="cold")]) for i, p in enumerate(prompts)]

    def hit(level: int, seed: int) -> list[Session]:
        sessions = cold(level, seed)
        for session in sessions:
            session.turns[0].image, session.turns[0].group = shared, "hit"
        return sessions

    prime = hit(1, -1)[0]
    tags = {"image_size": opts.image_size}
    return [Phase(tags, cold, name="image cold"), Phase(tags, hit, prime, "image hit")]


def _with_prefix(
    opts: WorkloadOptions, i: int, prefix: list[int], suffix: int, seed: int, group: str
) -> Session:
    user = make_prompts(1, suffix, seed=seed * 100_003 + i)[0]
    req = _request(opts, i, user, group=group)
    req.prefix = prefix
    return Session([req])


def tokenizer_text(tokenizer_path: str) -> Callable[[list[int]], str]:
    """Token ids -> text with MODEL_DIR's tokenizer, for servers that take only strings.

    Random ids do not survive decode/encode: the text re-encodes longer, so it is cut back to
    the wanted length a few times until it re-encodes close to it."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(f"{tokenizer_path.rstrip('/')}/tokenizer.json")

    done: dict[tuple[int, ...], str] = {}  # a shared prefix is rendered once

    def to_text(ids: list[int]) -> str:
        key = tuple(ids)
        if key not in done:
            text = tok.decode(ids)
            for _ in range(3):
                text = tok.decode(tok.encode(text).ids[: len(ids)])
            done[key] = text
        return done[key]

    return to_text


def render(sessions: list[Session], to_text: Callable[[list[int]], str]) -> None:
    """Turn every token-id prompt of ``sessions`` into text, in place (before the clock starts)."""
    for session in sessions:
        for req in session.turns:
            if isinstance(req.user, list):
                req.user = to_text(req.user)
            if isinstance(req.prefix, list):
                req.prefix = to_text(req.prefix)
