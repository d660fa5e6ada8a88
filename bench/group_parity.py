"""Greedy parity of two servers (a worker group against one process), partings shown as near-ties.

    python bench/group_parity.py fetch URL OUT.json [--model bench] [--prompts 8] [--max-tokens 48]
    python bench/group_parity.py compare ONE.json GROUP.json

``fetch`` asks ``URL`` for greedy completions of fixed prompts with the top 2 log-probabilities
of every token. ``compare`` says, per prompt, whether the two token sequences are identical and,
where they part, at which token and by what margin (top-1 minus top-2 log-probability) each
side chose: a group sums its shards' partial products in another order than one process does,
so in bf16 a near-tie (a margin of a few hundredths) can fall either way; a large margin at a
parting would be a fault.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import httpx


def prompt(i: int) -> str:
    return f"Request {i}: " + "tell me about the sea " * (i + 2)


def fetch(url: str, out: Path, model: str, prompts: int, max_tokens: int) -> None:
    answers = []
    for i in range(prompts):
        body = {
            "model": model,
            "prompt": prompt(i),
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "logprobs": 2,
        }
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=600)
        r.raise_for_status()
        lp = r.json()["choices"][0]["logprobs"]
        answers.append({"tokens": lp["tokens"], "top": lp["top_logprobs"]})
    out.write_text(json.dumps(answers))


def margin(top: dict[str, float]) -> float:
    best = sorted(top.values(), reverse=True)
    return best[0] - best[1] if len(best) > 1 else float("inf")


def parting(a: dict[str, Any], b: dict[str, Any]) -> str:
    for i, (x, y) in enumerate(zip(a["tokens"], b["tokens"], strict=False)):
        if x != y:
            ma, mb = margin(a["top"][i]), margin(b["top"][i])
            return f"parts at token {i}: margins {ma:.4f} (one) / {mb:.4f} (group)"
    return "identical"


def compare(one: Path, group: Path) -> None:
    a, b = json.loads(one.read_text()), json.loads(group.read_text())
    lines = [parting(x, y) for x, y in zip(a, b, strict=True)]
    print(f"group == one: {lines.count('identical')}/{len(lines)} identical")
    for i, line in enumerate(lines):
        print(f"  prompt {i}: {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch")
    f.add_argument("url")
    f.add_argument("out", type=Path)
    f.add_argument("--model", default="bench")
    f.add_argument("--prompts", type=int, default=8)
    f.add_argument("--max-tokens", type=int, default=48)
    c = sub.add_parser("compare")
    c.add_argument("one", type=Path)
    c.add_argument("group", type=Path)
    args = parser.parse_args()
    if args.cmd == "fetch":
        fetch(args.url, args.out, args.model, args.prompts, args.max_tokens)
    else:
        compare(args.one, args.group)


if __name__ == "__main__":
    main()
