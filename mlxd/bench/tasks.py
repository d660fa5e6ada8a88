"""Text prompts for the scenarios that measure speculative decoding (issue #20): ``edit`` (a code
file and an instruction to change it: the answer is mostly a copy of the prompt), ``json`` (CSV
records to turn into JSON: repeated keys, copied values) and ``chat`` (open questions: little
to copy). Each is built from a seed, so every request of a level has its own text and nothing
is served from the prefix cache by accident.
"""

from __future__ import annotations

import random

_NAMES = (
    "total",
    "count",
    "items",
    "values",
    "result",
    "index",
    "buffer",
    "offset",
    "limit",
    "scale",
    "weight",
    "record",
    "entry",
    "price",
    "amount",
    "score",
    "step",
)
_VERBS = (
    "load",
    "parse",
    "merge",
    "filter",
    "update",
    "render",
    "check",
    "count",
    "split",
    "clean",
    "score",
    "build",
)
_NOUNS = (
    "orders",
    "users",
    "events",
    "rows",
    "lines",
    "tokens",
    "pages",
    "files",
    "prices",
    "scores",
    "tasks",
    "blocks",
)
_CITIES = ("Paris", "Lyon", "Oslo", "Lima", "Kyoto", "Cairo", "Dublin", "Quito", "Perth", "Riga")
_FIRST = (
    "Ana",
    "Ben",
    "Chloe",
    "Dev",
    "Emma",
    "Farid",
    "Grace",
    "Hugo",
    "Ines",
    "Jon",
    "Kim",
    "Liam",
    "Maya",
    "Noor",
    "Omar",
    "Pia",
)
_TOPICS = (
    "why the sky is blue",
    "how a bicycle stays upright",
    "what makes bread rise",
    "how vaccines train the immune system",
    "why leaves change colour in autumn",
    "how a compass works",
    "what causes tides",
    "how bees make honey",
    "why cats purr",
    "how rainbows form",
    "what a black hole is",
    "how coffee is roasted",
)


def edit_prompt(seed: int, functions: int = 4) -> str:
    """A small Python module and the instruction to rename one variable everywhere."""
    rng = random.Random(seed)
    old = rng.choice(_NAMES)
    new = f"{old}_{rng.choice(('sum', 'acc', 'val', 'tmp'))}"
    code = "\n\n".join(_function(rng, old) for _ in range(functions))
    return (
        f"Rename the variable `{old}` to `{new}` in this Python file. Change nothing else "
        f"and return the whole file.\n\n```python\n{code}\n```"
    )


def json_prompt(seed: int, records: int = 12) -> str:
    """CSV records and the instruction to return them as a JSON array of objects."""
    rng = random.Random(seed)
    lines = ["name,age,city,member"]
    for _ in range(records):
        lines.append(
            f"{rng.choice(_FIRST)},{rng.randrange(18, 90)},{rng.choice(_CITIES)},"
            f"{rng.choice(('yes', 'no'))}"
        )
    csv = "\n".join(lines)
    return (
        "Convert these CSV records to a JSON array of objects with the keys name, age, "
        "city and member (age as a number, member as true or false). Reply with the JSON "
        f"only.\n\n{csv}"
    )


def chat_prompt(seed: int) -> str:
    """An open question: the answer copies little of the prompt."""
    rng = random.Random(seed)
    return f"Explain {rng.choice(_TOPICS)} to a curious ten-year-old, in a few paragraphs."


def _function(rng: random.Random, var: str) -> str:
    verb, noun = rng.choice(_VERBS), rng.choice(_NOUNS)
    arg, other = rng.sample([n for n in _NAMES if n != var], 2)
    k = rng.randrange(2, 9)
    return (
        f"def {verb}_{noun}({arg}, {other}={k}):\n"
        f'    """{verb.capitalize()} the {noun} in {arg}."""\n'
        f"    {var} = 0\n"
        f"    for item in {arg}:\n"
        f"        if item > {other}:\n"
        f"            {var} += item * {k}\n"
        f"        else:\n"
        f"            {var} -= {other}\n"
        f"    return {var}"
    )
