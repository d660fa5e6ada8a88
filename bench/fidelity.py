"""Greedy fidelity: do servers answer 12 fixed chat prompts exactly as `mlx_lm.generate` does?

For each prompt the reference is mlx-lm's own greedy generation in this process. Then, for each
server URL given (mlxd, mlx_lm.server, any OpenAI-compatible one), the prompts are sent one at a
time ("lone") and all at once ("batched"), greedy, through `/v1/chat/completions`. A lone answer
matches when it equals the reference; a batched one when it equals the same server's lone one.

Two in-process variants help find the source of a difference (the models issue, point 8):
``whole`` prefills the whole prompt in one forward and takes the first token from it (mlx-lm's
generate feeds the last prompt token in a forward of its own); ``float32`` takes each greedy
token from float32 logits. A server whose lone answers match a variant rather than mlx-lm
computes as that variant does.

    python bench/fidelity.py --model DIR --server mlxd=http://127.0.0.1:8123 \\
        --server mlx_lm=http://127.0.0.1:8124 --json out.json

``--float16 SRC`` first writes DIR as SRC's weights cast to float16 (the real model of the
tests is converted to float32 on the CPU).

Every parting (a served answer that is not mlx-lm's) is then shown as a near-tie or not: at its
first differing token, after the prompt and the tokens both share, mlx-lm's log-probabilities
of its own token and of the server's, their margin and the server token's rank (``partings``
in the JSON). ``--partings-of OLD.json`` does only that, for
the answers of an earlier run (e.g. the GPU's, on this machine).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

PROMPTS = [
    "What is the capital of France?",
    "Write a Python function that returns the n-th Fibonacci number.",
    "List five fruits that are red.",
    "Explain in two sentences why the sky is blue.",
    "Translate 'good morning, how are you?' into Spanish.",
    "Write a haiku about the sea.",
    "What is 17 times 23? Show your steps.",
    "Give me three tips for sleeping better.",
    "Summarise the plot of Romeo and Juliet in one paragraph.",
    "Return a JSON object with the keys name and age for a person called Ada, aged 36.",
    "What are the main differences between a cat and a dog as pets?",
    "Rename the variable x to total in this code: x = 0\nfor i in range(10):\n    x += i\nprint(x)",
]


def to_float16(src: Path, dst: Path) -> None:
    """``src``'s mlx-lm directory with every floating weight cast to float16."""
    import mlx.core as mx

    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.suffix != ".safetensors" and f.is_file():
            shutil.copy(f, dst / f.name)
    for f in src.glob("*.safetensors"):
        weights = mx.load(str(f))
        cast = {
            k: v.astype(mx.float16) if mx.issubdtype(v.dtype, mx.floating) else v
            for k, v in weights.items()
        }
        mx.save_safetensors(str(dst / f.name), cast, metadata={"format": "mlx"})
    config = json.loads((dst / "config.json").read_text())
    config["torch_dtype"] = "float16"
    (dst / "config.json").write_text(json.dumps(config, indent=2))


def reference(model_dir: Path, max_tokens: int) -> dict[str, list[str]]:
    """mlx-lm's greedy answers, and those of the diagnostic variants."""
    import mlx.core as mx
    import mlx_lm
    from mlx_lm.models.cache import make_prompt_cache

    model, tokenizer = mlx_lm.load(str(model_dir))[:2]
    eos = set(tokenizer.eos_token_ids)

    def greedy(ids: list[int], whole: bool, fp32: bool) -> str:
        cache = make_prompt_cache(model)
        head = ids if whole else ids[:-1]
        logits = model(mx.array([head]), cache=cache)[:, -1]
        if not whole:
            logits = model(mx.array([ids[-1:]]), cache=cache)[:, -1]
        out: list[int] = []
        while len(out) < max_tokens:
            tok = int(mx.argmax(logits.astype(mx.float32) if fp32 else logits, axis=-1).item())
            if tok in eos:
                break
            out.append(tok)
            logits = model(mx.array([[tok]]), cache=cache)[:, -1]
        return str(tokenizer.decode(out))

    result: dict[str, list[str]] = {"mlx_lm": [], "whole": [], "float32": []}
    for prompt in PROMPTS:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True
        )
        result["mlx_lm"].append(mlx_lm.generate(model, tokenizer, ids, max_tokens=max_tokens))
        result["whole"].append(greedy(ids, whole=True, fp32=False))
        result["float32"].append(greedy(ids, whole=False, fp32=True))
    return result


def ask(url: str, model: str, prompt: str, max_tokens: int) -> str:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
    }
    req = urllib.request.Request(
        f"{url}/v1/chat/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=600) as resp:
        return str(json.load(resp)["choices"][0]["message"]["content"])


def served(url: str, model: str, max_tokens: int) -> dict[str, list[str]]:
    lone = [ask(url, model, p, max_tokens) for p in PROMPTS]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        batched = list(pool.map(lambda p: ask(url, model, p, max_tokens), PROMPTS))
    return {"lone": lone, "batched": batched}


def first_difference(a: str, b: str) -> int | None:
    """The first character where ``a`` and ``b`` differ (None: equal)."""
    if a == b:
        return None
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def summary(ref: dict[str, list[str]], servers: dict[str, dict[str, list[str]]]) -> dict[str, Any]:
    """Per server: lone == mlx-lm, batched == lone, and which variant each lone answer equals."""
    out: dict[str, Any] = {
        "variants": {
            v: sum(a == b for a, b in zip(ref[v], ref["mlx_lm"], strict=True)) for v in ref
        }
    }
    for name, got in servers.items():
        lone, batched = got["lone"], got["batched"]
        out[name] = {
            "lone_equal_mlx_lm": sum(a == b for a, b in zip(lone, ref["mlx_lm"], strict=True)),
            "batched_equal_lone": sum(a == b for a, b in zip(batched, lone, strict=True)),
            "batched_equal_mlx_lm": sum(
                a == b for a, b in zip(batched, ref["mlx_lm"], strict=True)
            ),
            "lone_first_difference": [
                first_difference(a, b) for a, b in zip(lone, ref["mlx_lm"], strict=True)
            ],
            "lone_equal_variant": {
                v: sum(a == b for a, b in zip(lone, ref[v], strict=True)) for v in ref
            },
        }
    return out


def partings(model_dir: Path, result: dict[str, Any]) -> list[dict[str, Any]]:
    """Each served answer that parts from mlx-lm's: where, and mlx-lm's top-2 margin there."""
    import mlx_lm

    model, tokenizer = mlx_lm.load(str(model_dir))[:2]
    out = []
    for name, got in result["servers"].items():
        for kind, answers in got.items():
            for i, (ans, ref) in enumerate(
                zip(answers, result["reference"]["mlx_lm"], strict=True)
            ):
                if ans != ref:
                    row = _parting(model, tokenizer, PROMPTS[i], ref, ans)
                    out.append({"server": name, "kind": kind, "prompt": i, **row})
    return out


def _parting(model: Any, tokenizer: Any, prompt: str, ref: str, got: str) -> dict[str, Any]:
    """The first token where ``got`` leaves ``ref`` and mlx-lm's log-probabilities there."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    a, b = (
        tokenizer.encode(ref, add_special_tokens=False),
        tokenizer.encode(got, add_special_tokens=False),
    )
    k = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    if k >= min(len(a), len(b)):
        return {"token": k, "note": "one answer ends where the other goes on"}
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True
    )
    cache = make_prompt_cache(model)  # as mlx-lm's generate: all but the last token, then it
    model(mx.array([ids[:-1]]), cache=cache)
    logits = model(mx.array([[ids[-1], *a[:k]]]), cache=cache)[0, -1]
    lp = logits.astype(mx.float32) - mx.logsumexp(logits.astype(mx.float32))
    return {
        "token": k,
        "ids": [a[k], b[k]],  # mlx-lm's, the server's
        "text": [tokenizer.decode(a[: k + 1])[-12:], tokenizer.decode(b[: k + 1])[-12:]],
        "margin": round(float(lp[a[k]] - lp[b[k]]), 4),
        "server_rank": int((lp > lp[b[k]]).sum().item()),  # 1: mlx-lm's runner-up
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True, help="mlx-lm directory (the reference)")
    ap.add_argument("--float16", type=Path, help="write --model first: this directory in float16")
    ap.add_argument("--server", action="append", default=[], help="NAME=URL[#MODEL]")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--partings-of", type=Path, help="only the partings of this earlier JSON")
    args = ap.parse_args()
    if args.partings_of:
        print(json.dumps(partings(args.model, json.loads(args.partings_of.read_text())), indent=1))
        return
    if args.float16:
        to_float16(args.float16, args.model)
    t0 = time.time()
    ref = reference(args.model, args.max_tokens)
    print(f"reference: {time.time() - t0:.1f} s", file=sys.stderr)
    servers = {}
    for spec in args.server:
        name, _, rest = spec.partition("=")
        url, _, model = rest.partition("#")
        servers[name] = served(url, model or "default", args.max_tokens)
    result: dict[str, Any] = {
        "summary": summary(ref, servers),
        "reference": ref,
        "servers": servers,
    }
    result["partings"] = partings(args.model, result)
    print(json.dumps(result["summary"], indent=1))
    print(json.dumps(result["partings"], indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
