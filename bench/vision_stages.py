"""Where one image request's time goes, in-process: a VLM checkpoint's stages timed apart.

    python bench/vision_stages.py MODEL_DIR [--image-size 448] [--prompt-tokens 128]
        [--batch 16] [--repeats 5] [--out FILE.json]

Stages (medians of --repeats after two unmeasured rounds; mlx-vlm's own modules, as mlxd's
worker and mlx-vlm's server both call them):

  host         PNG decode (PIL) and the checkpoint's processor, one image
  tower        the vision tower and the merge (``get_input_embeddings``) for one image
  tower_batch  the same for --batch images in one call (one prompt with --batch images)
  prefill      the language model over the prompt (image tokens + --prompt-tokens words), from
               the spliced embeddings, one row, into a fresh cache
  first        tower + prefill in one forward (``model(...)``), the TTFT a lone request pays
               on the engine thread
  decode       one decode step after ``first``, one row

An issue-39 probe: the served TTFT of a lone image request against these stages says whether the
time is in the model or around it.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mlxd.bench.images import png_data_url  # noqa: E402
from mlxd.bench.workload import make_prompts, words  # noqa: E402


def timed(fn: Callable[[], Any], repeats: int) -> float:
    """Median seconds of ``fn`` after two unmeasured calls."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def picture(side: int, seed: int) -> Any:
    from PIL import Image

    raw = base64.b64decode(png_data_url(side, seed).split(",", 1)[1])
    with Image.open(io.BytesIO(raw)) as im:
        return im.convert("RGB")


def chat_text(processor: Any, images: int, text: str) -> str:
    content = [{"type": "image"}] * images + [{"type": "text", "text": text}]
    messages = [{"role": "user", "content": content}]
    return str(processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))


def inputs(processor: Any, pictures: list[Any], text: str) -> dict[str, mx.array]:
    out = processor(images=pictures, text=[chat_text(processor, len(pictures), text)])
    return {k: mx.array(v) for k, v in out.items() if k != "attention_mask"}


def stages(model: Any, processor: Any, args: argparse.Namespace) -> dict[str, Any]:
    text = words(make_prompts(1, args.prompt_tokens, seed=1)[0])
    one = [picture(args.image_size, 1)]
    many = [picture(args.image_size, s) for s in range(args.batch)]
    x1, xb = inputs(processor, one, text), inputs(processor, many, text)
    extra1 = {k: v for k, v in x1.items() if k not in ("input_ids", "pixel_values")}
    extrab = {k: v for k, v in xb.items() if k not in ("input_ids", "pixel_values")}
    out: dict[str, Any] = {"prompt_tokens": int(x1["input_ids"].shape[1])}
    out["image_tokens"] = int((x1["input_ids"] == _image_token(model)).sum().item())
    out["host_s"] = timed(lambda: processor(images=one, text=[chat_text(processor, 1, text)]), 5)

    def tower(x: dict[str, mx.array], extra: dict[str, mx.array]) -> mx.array:
        ids = x["input_ids"]
        mask = mx.ones(ids.shape, dtype=mx.int32)
        e = model.get_input_embeddings(ids, x["pixel_values"], mask=mask, **extra)
        mx.eval(e.inputs_embeds)
        return e.inputs_embeds

    out["tower_s"] = timed(lambda: tower(x1, extra1), args.repeats)
    out["tower_batch_s"] = timed(lambda: tower(xb, extrab), args.repeats)
    out["batch"] = args.batch
    embeds = tower(x1, extra1)

    def prefill() -> Any:
        cache = model.language_model.make_cache()
        logits = model.language_model(x1["input_ids"], inputs_embeds=embeds, cache=cache, **extra1)
        mx.eval(getattr(logits, "logits", logits))
        return cache

    def first() -> Any:
        cache = model.language_model.make_cache()
        logits = model(x1["input_ids"], x1["pixel_values"], cache=cache, **extra1)
        mx.eval(getattr(logits, "logits", logits))
        return cache

    out["prefill_s"] = _guard(lambda: timed(prefill, args.repeats))
    out["first_s"] = _guard(lambda: timed(first, args.repeats))
    out["decode_s"] = _guard(lambda: _decode(model, first(), args.repeats))
    return out


def _decode(model: Any, cache: Any, repeats: int) -> float:
    token = mx.array([[11]])

    def step() -> None:
        logits = model.language_model(token, cache=cache)
        mx.eval(getattr(logits, "logits", logits))

    return timed(step, repeats)


def _guard(fn: Callable[[], float]) -> float | str:
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - a probe reports what failed and goes on
        return f"failed: {type(exc).__name__}: {exc}"[:300]


def _image_token(model: Any) -> int:
    config = model.config
    return int(getattr(config, "image_token_id", None) or config.image_token_index)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", type=Path)
    p.add_argument("--image-size", type=int, default=448)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    from mlx_vlm import load

    model, processor = load(str(args.model))
    result = {"model": str(args.model), "device": str(mx.default_device())}
    result.update(stages(model, processor, args))
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
