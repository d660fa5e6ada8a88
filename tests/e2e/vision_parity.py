"""The vision parity harness: a made VLM's greedy answers through the daemon against mlx-vlm's.

Each ``test_vision_*.py`` family file names its ``Family`` (the served name, the question, the
processor outputs mlx-vlm's ``generate`` takes) and calls a ``Parity``'s checks: an image alone,
text alone, images in a busy batch beside text requests, a prefix hit on the same image and
none on another, a later turn, two images in one prompt, preemption. What one family alone has
(mRoPE, deepstack, tiles, a capped context) stays in its file. mlx-vlm, MLX and PIL are
imported only when a check runs: the family files skip without the ``vision`` extra.
"""

from __future__ import annotations

import base64
import io
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property, partial
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.e2e.conftest import Daemon, start_daemon, stop_daemon

BLOCK = 32  # the daemon's default KV block size
PREEMPT_TOKENS = 64  # long enough answers to outgrow a tight pool
SHORT_QUESTION = "What is in this picture? Describe it."
# Long enough that the prompt's last whole block lies past the image: a hit covers it all.
LONG_QUESTION = (
    "What is in this picture? Describe it in detail: the colours, the shapes, the light "
    "and anything written on it."
)
FOLLOW_UP = "And what colour is it? Answer in one long sentence."


@dataclass(frozen=True)
class Family:
    """What one family's parity tests differ in."""

    name: str  # the model's name in the daemon
    question: str
    max_tokens: int
    image_keys: tuple[str, ...]  # the processor's outputs generate takes for images
    mask: bool = True  # whether generate takes the processor's attention_mask
    ragged_pixels: bool = False  # pixel_values may be a list of images of different sizes
    prepare: Callable[[Any], None] | None = None  # fixes mlx-vlm's loaded processor


# Images, messages, answers


def png(seed: int, size: tuple[int, int] = (130, 90)) -> bytes:
    """A PNG of seeded random pixels, ``size`` = (width, height)."""
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def data_url(image: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(image).decode()


def image_part(image: bytes) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": data_url(image)}}


def story(n: int) -> list[dict[str, Any]]:
    """A text chat, the ``n``-th of its kind."""
    return [{"role": "user", "content": f"Tell me story number {n} about the sea."}]


def tokens(answer: Any) -> list[str]:
    """The answer's tokens, one string each (from its logprobs)."""
    return [t.token for t in answer.choices[0].logprobs.content]


def cached(answer: Any) -> int:
    details = answer.usage.prompt_tokens_details
    return 0 if details is None else details.cached_tokens or 0


def together(calls: list[Callable[[], Any]]) -> list[Any]:
    """Each call's result, all started at once (one thread each)."""
    results: dict[int, Any] = {}

    def run(n: int) -> None:
        results[n] = calls[n]()

    threads = [threading.Thread(target=run, args=(n,)) for n in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [results[n] for n in range(len(calls))]


# Models and daemons


def made(tmp_path_factory: pytest.TempPathFactory, arch: str) -> Path:
    """A tiny random VLM of family ``arch`` in a fresh temporary directory."""
    from mlxd.models.vlm_maker import make_vlm

    out = tmp_path_factory.mktemp("vlm") / arch
    return make_vlm(out, arch=arch, progress=lambda line: None)


def served(path: Path, *args: str, name: str) -> Iterator[Daemon]:
    """A module fixture's daemon for ``path`` (``yield from`` it), stopped after."""
    d = start_daemon(path, *args, name=name)
    yield d
    if d.proc.poll() is None:
        stop_daemon(d)


def client_of(daemon: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key="unused", max_retries=0)


# The harness


class Parity:
    """One made model's answers: the daemon's (through the OpenAI client) and mlx-vlm's own
    greedy ``generate`` (loaded on first use), compared token for token."""

    def __init__(self, path: Path, family: Family) -> None:
        self.path = path
        self.family = family

    def messages(self, image: bytes) -> list[dict[str, Any]]:
        """One user turn: the image, then the family's question."""
        text = {"type": "text", "text": self.family.question}
        return [{"role": "user", "content": [image_part(image), text]}]

    def ask(
        self,
        client: openai.OpenAI,
        messages: list[dict[str, Any]],
        max_tokens: int | None = None,
        model: str | None = None,
    ) -> Any:
        return client.chat.completions.create(
            model=model or self.family.name,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=max_tokens or self.family.max_tokens,
            temperature=0,
            logprobs=True,
        )

    def expected(
        self, images: list[bytes], messages: list[dict[str, Any]], max_tokens: int | None = None
    ) -> list[str]:
        """mlx-vlm's answer as ``tokens`` gives the daemon's."""
        return self.text_of(self.reference(images, messages, max_tokens))

    def reference(
        self, images: list[bytes], messages: list[dict[str, Any]], max_tokens: int | None = None
    ) -> list[int]:
        """mlx-vlm's greedy token ids for a chat's images (in prompt order; none for a text
        chat) and its messages, with the inputs its processor makes of them."""
        import mlx.core as mx
        from mlx_vlm import generate
        from PIL import Image

        model, processor = self._mlx_vlm
        pictures = [Image.open(io.BytesIO(i)).convert("RGB") for i in images]
        text = processor.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        inputs = processor(images=pictures or None, text=[text])
        extra = {k: self._array(inputs[k]) for k in self.family.image_keys} if pictures else {}
        if self.family.mask:
            extra["mask"] = mx.array(inputs["attention_mask"])
        out = generate(
            model,
            processor,
            text,
            input_ids=mx.array(inputs["input_ids"]),
            max_tokens=max_tokens or self.family.max_tokens,
            temperature=0.0,
            verbose=False,
            **extra,
        )
        return list(out.token_ids)

    def text_of(self, ids: list[int]) -> list[str]:
        """Token ids as the answer's logprobs give them: each token's own text."""
        return [self._tokenizer.decode([i]) for i in ids]

    def last_image_position(self, image: bytes, token_id: int) -> int:
        """Where ``messages(image)``'s last ``token_id`` sits, as the model's own processor
        (as saved, before ``Family.prepare``) lays the prompt out."""
        from mlx_vlm.utils import load_processor
        from PIL import Image

        processor = load_processor(self.path)
        text = processor.tokenizer.apply_chat_template(
            self.messages(image), add_generation_prompt=True, tokenize=False
        )
        picture = Image.open(io.BytesIO(image)).convert("RGB")
        ids = [int(i) for i in processor(images=[picture], text=[text])["input_ids"][0].tolist()]
        return max(p for p, i in enumerate(ids) if i == token_id)

    # Checks shared by the families

    def check_image(self, client: openai.OpenAI, image: bytes) -> Any:
        """An image alone answers as mlx-vlm; the answer, for the family's own checks."""
        answer = self.ask(client, self.messages(image))
        assert tokens(answer) == self.expected([image], self.messages(image))
        return answer

    def check_text(self, client: openai.OpenAI, messages: list[dict[str, Any]]) -> None:
        assert tokens(self.ask(client, messages)) == self.expected([], messages)

    def check_batch(
        self,
        client: openai.OpenAI,
        images: list[bytes],
        texts: list[list[dict[str, Any]]],
        images_differ: bool = True,
    ) -> None:
        """Image chats and text chats at once (one decode batch, prefill chunks with and
        without images side by side): each answer is its own alone."""
        chats = [self.messages(i) for i in images] + texts
        answers = together([partial(self.ask, client, c) for c in chats])
        alone = [self.reference([i], c) for i, c in zip(images, chats, strict=False)]
        if images_differ:
            assert len({tuple(ids) for ids in alone}) > 1  # the answers depend on the image
        alone += [self.reference([], c) for c in texts]
        for n, ids in enumerate(alone):
            assert tokens(answers[n]) == self.text_of(ids), n

    def check_hit_and_miss(
        self,
        client: openai.OpenAI,
        first: bytes,
        second: bytes,
        least_hit: int,
        answers_differ: bool = True,
    ) -> None:
        """The same image twice: the second hits at least ``least_hit`` tokens and answers as
        the first; another image with the same text and positions never hits."""
        once = self.ask(client, self.messages(first))
        again = self.ask(client, self.messages(first))
        assert cached(again) >= least_hit, (cached(again), least_hit)
        expected = self.expected([first], self.messages(first))
        assert tokens(again) == tokens(once) == expected
        other = self.ask(client, self.messages(second))
        assert cached(other) < BLOCK  # the first block holds image tokens: no block matches
        assert tokens(other) == self.expected([second], self.messages(second))
        if answers_differ:
            assert tokens(other) != expected

    def check_later_turn(self, client: openai.OpenAI, image: bytes) -> None:
        """The second turn hits the first's blocks (image included); its new text follows."""
        first = self.ask(client, self.messages(image))
        messages = [
            *self.messages(image),
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": FOLLOW_UP},
        ]
        later = self.ask(client, messages)
        assert cached(later) >= 2 * BLOCK
        assert tokens(later) == self.expected([image], messages)

    def check_two_images(
        self, client: openai.OpenAI, first: bytes, second: bytes, swapped: bool = True
    ) -> Any:
        """Two images in one prompt (and, ``swapped``, the other way round: other keys)
        answer as mlx-vlm; the first answer, for the family's own checks."""
        content = [
            image_part(first),
            {"type": "text", "text": "This is the first one. And the second:"},
            image_part(second),
            {"type": "text", "text": self.family.question},
        ]
        messages = [{"role": "user", "content": content}]
        answer = self.ask(client, messages)
        assert tokens(answer) == self.expected([first, second], messages)
        if swapped:
            other = [{"role": "user", "content": [content[2], content[1], content[0], content[3]]}]
            assert tokens(self.ask(client, other)) == self.expected([second, first], other)
        return answer

    def check_preempted(self, tight: Daemon, images: list[bytes]) -> None:
        """Image requests on a pool too small for their answers: preempted, they recompute
        their prompts (image included) and their answers so far, and answer as mlx-vlm."""
        client = client_of(tight)
        chats = [self.messages(i) for i in images]
        answers = together([partial(self.ask, client, c, PREEMPT_TOKENS) for c in chats])
        stats = tight.admin_get(f"/admin/models/{self.family.name}/stats").json()
        assert stats["preemptions"] > 0, stats
        for n, (image, chat) in enumerate(zip(images, chats, strict=True)):
            assert tokens(answers[n]) == self.expected([image], chat, PREEMPT_TOKENS), n

    # Internal helpers

    @cached_property
    def _mlx_vlm(self) -> tuple[Any, Any]:
        from mlx_vlm import load

        model, processor = load(str(self.path))
        if self.family.prepare is not None:
            self.family.prepare(processor)
        return model, processor

    @cached_property
    def _tokenizer(self) -> Any:
        from mlx_lm.utils import load_tokenizer

        return load_tokenizer(self.path)

    def _array(self, values: Any) -> Any:
        import mlx.core as mx

        if self.family.ragged_pixels and isinstance(values, list):
            return [mx.array(v) for v in values]  # each image keeps its own size
        return mx.array(values)
