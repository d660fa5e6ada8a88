"""The image encoder: a chat's images to placeholder tokens, pixels, and features for prefill.

Three stages, two threads. ``prepare`` decodes the images (PIL) and runs the checkpoint's
processor (resize, normalize, the placeholder tokens each image becomes) on a thread pool, off
the engine's MLX thread: a burst of large images never stalls a decode step. The vision tower
runs on the engine thread, lazily, when a prefill chunk first reaches an image's placeholders
(a prompt whose images all sit in a prefix-cache hit never runs it); ``embeddings`` splices
its features into that chunk's token embeddings at the placeholder positions. The features are
dropped once the prompt's prefill is done; each image's are kept by its digest in a bounded
``FeatureCache`` too, so a prompt whose image is only partly in the prefix cache (its last
placeholders past the last whole block), a later turn about it, or a preempted sequence
resuming, never runs the tower for it again.
"""

from __future__ import annotations

import io
import logging
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import numpy as np

from mlxd.errors import InvalidRequest
from mlxd.knobs import MAX_IMAGE_PIXELS
from mlxd.models.vision_layout import FEATURE_CACHE_BYTES
from mlxd.protocol.messages import ImageData

if TYPE_CHECKING:
    from mlxd.worker.sched.sequence import Sequence
    from mlxd.worker.vision.model import TextModel

log = logging.getLogger(__name__)

PREPARE_THREADS = 2  # image decoding and processing run beside the engine thread
# Narrower images are refused: processors take a side of 1 for the channel axis.
MIN_IMAGE_SIDE = 2
# Placeholder keys are negative (token ids are not): -(1 + the digest's first 60 bits).
_KEY_HEX_DIGITS = 15


@dataclass(eq=False)
class PromptImages:
    """A prompt's images once prepared: their pixels, where their placeholders sit in the
    prompt (in feature order), and the vision tower's features (while prefill needs them)."""

    pixel_values: np.ndarray
    positions: np.ndarray  # (image tokens,) prompt positions, ascending
    digests: list[str]
    features: mx.array | None = None  # (image tokens, hidden)

    def overlaps(self, start: int, end: int) -> bool:
        """Whether prompt positions ``start .. end`` hold any placeholder."""
        i = int(np.searchsorted(self.positions, start))
        return i < len(self.positions) and int(self.positions[i]) < end


@dataclass(slots=True)
class EncoderCounters:
    """The vision tower's work since the worker started (the worker's stats report it)."""

    encoded: int = 0  # images through the tower
    seconds: float = 0.0  # the tower's time, evaluated on the engine thread


class FeatureCache:
    """Each image's vision-tower features by its digest, least recently used first out,
    within ``max_bytes``. Features depend on the image alone (its pixels, processed the same
    way each time), never on the text around it."""

    def __init__(self, max_bytes: int = FEATURE_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.num_bytes = 0
        self._entries: OrderedDict[str, mx.array] = OrderedDict()

    def get(self, digests: list[str]) -> list[mx.array] | None:
        """Every digest's features in order, or None unless all are here."""
        if not all(d in self._entries for d in digests):
            return None
        for d in digests:
            self._entries.move_to_end(d)
        return [self._entries[d] for d in digests]

    def put(self, digest: str, features: mx.array) -> None:
        if digest in self._entries or features.nbytes > self.max_bytes:
            return
        self._entries[digest] = features
        self.num_bytes += features.nbytes
        while self.num_bytes > self.max_bytes:
            _, old = self._entries.popitem(last=False)
            self.num_bytes -= old.nbytes


@dataclass(frozen=True, slots=True)
class Prepared:
    """What ``prepare`` makes of a chat: its token ids, its images, its prefix-cache keys."""

    prompt_ids: list[int]
    images: PromptImages
    keys: list[int]


class ImageEncoder:
    """A VLM's processor and vision tower, beside the language model the runners drive."""

    def __init__(self, vlm: Any, processor: Any, text: TextModel) -> None:
        self.vlm = vlm
        self.processor = processor
        self.text = text
        self.image_token_id = int(vlm.config.image_token_index)
        self.pool = ThreadPoolExecutor(PREPARE_THREADS, thread_name_prefix="images")
        self.counters = EncoderCounters()
        self.cache = FeatureCache()
        self.max_pixels = MAX_IMAGE_PIXELS.default  # --max-image-pixels
        from PIL import Image

        Image.MAX_IMAGE_PIXELS = None  # max_pixels is the limit (PIL's would refuse first)

    def prepare(self, text: str, images: list[ImageData]) -> Future[Prepared]:
        """Decode ``images`` and process them with the rendered chat ``text``, on the pool.
        The future raises ``InvalidRequest`` for bytes that are no image this model takes."""
        return self.pool.submit(self._prepare, text, images)

    def embeddings(
        self, tokens: mx.array, parts: list[tuple[Sequence, int, int]]
    ) -> mx.array | None:
        """The input embeddings of a left-padded prefill forward of ``tokens`` (B, W), whose
        row ``b`` holds ``parts[b]``'s sequence's prefill positions ``start .. end``, with
        image features at their placeholders; None when no row reaches an image."""
        if not any(s.images is not None and s.images.overlaps(a, e) for s, a, e in parts):
            return None
        h = self.text.embed(tokens)
        width = tokens.shape[1]
        for b, (seq, start, end) in enumerate(parts):
            img = seq.images
            if img is None or not img.overlaps(start, end):
                continue
            picked = np.nonzero((img.positions >= start) & (img.positions < end))[0]
            columns = width - (end - start) + img.positions[picked] - start
            features = self._features(seq, img)
            h[b, mx.array(columns)] = features[mx.array(picked)].astype(h.dtype)
        return h

    def done_with(self, seq: Sequence) -> None:
        """``seq``'s prompt is prefilled: its features go (its pixels stay, for a recompute)."""
        if seq.images is not None:
            seq.images.features = None

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    # Internal helpers

    def _prepare(self, text: str, images: list[ImageData]) -> Prepared:
        pictures = [_decode(i, n, self.max_pixels) for n, i in enumerate(images)]
        try:  # no padding: mlx-vlm's LlavaProcessor would pass it to the image processor
            out = self.processor(images=pictures, text=[text])
        except Exception as exc:  # noqa: BLE001 - processors raise anything on odd inputs
            raise InvalidRequest(f"cannot process the images: {exc}", param="messages") from None
        ids = [int(t) for t in np.asarray(out["input_ids"]).reshape(-1)]
        positions = np.array([p for p, t in enumerate(ids) if t == self.image_token_id])
        if len(positions) % max(len(images), 1):
            raise InvalidRequest("the prompt's image placeholders do not match its images")
        digests = [i.digest for i in images]
        prompt_images = PromptImages(np.asarray(out["pixel_values"]), positions, digests)
        return Prepared(ids, prompt_images, _keys(ids, positions, digests))

    def _features(self, seq: Sequence, img: PromptImages) -> mx.array:
        """The vision tower's output at every placeholder of ``seq``'s prompt, through the
        model's own merge (``get_input_embeddings``), so any family that splices at its
        placeholders is served as mlx-vlm serves it; from the feature cache when every image
        of the prompt is there."""
        if img.features is None:
            cached = self.cache.get(img.digests)
            img.features = mx.concatenate(cached) if cached else self._encode(seq, img)
        return img.features

    def _encode(self, seq: Sequence, img: PromptImages) -> mx.array:
        began = time.perf_counter()
        ids = mx.array([seq.prompt_ids])
        # the mask as mlx-vlm's generate gives it (the processor's: one unpadded prompt);
        # Gemma 3's merge needs one, LLaVA's takes none
        mask = mx.ones(ids.shape, dtype=mx.int32)
        out = self.vlm.get_input_embeddings(ids, mx.array(img.pixel_values), mask=mask)
        features: mx.array = out.inputs_embeds[0][mx.array(img.positions)]
        mx.eval(features)  # the tower's time is measured here, not in the forward
        self.counters.encoded += len(img.digests)
        self.counters.seconds += time.perf_counter() - began
        per_image = len(img.positions) // len(img.digests)
        for n, digest in enumerate(img.digests):  # copies: a slice would keep the whole alive
            own = mx.contiguous(features[n * per_image : (n + 1) * per_image])
            mx.eval(own)
            self.cache.put(digest, own)
        return features


def _decode(image: ImageData, index: int, max_pixels: int) -> Any:
    """The decoded RGB picture, or ``InvalidRequest`` naming the image. Its size is checked
    from the header, before its pixels are decoded."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(image.data)) as picture:
            _check_size(picture.size, index, max_pixels)
            picture.load()  # the whole file now: a truncated one fails here, not in the processor
            return picture.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise InvalidRequest(
            f"image {index} is not a readable image: {exc}", param="messages"
        ) from None


def _check_size(size: tuple[int, int], index: int, max_pixels: int) -> None:
    width, height = size
    if width * height > max_pixels:
        raise InvalidRequest(
            f"image {index} is {width}x{height} pixels; at most {max_pixels} pixels "
            "(--max-image-pixels)",
            param="messages",
        )
    if min(width, height) < MIN_IMAGE_SIDE:
        raise InvalidRequest(
            f"image {index} is {width}x{height} pixels; each side must be at least "
            f"{MIN_IMAGE_SIDE}",
            param="messages",
        )


def _keys(ids: list[int], positions: np.ndarray, digests: list[str]) -> list[int]:
    """The prompt's prefix-cache keys: its ids, each image's placeholders replaced by a key of
    its digest, so blocks holding an image match only the same image."""
    keys = list(ids)
    per_image = len(positions) // max(len(digests), 1)
    for n, p in enumerate(positions.tolist()):
        keys[p] = -(1 + int(digests[n // per_image][:_KEY_HEX_DIGITS], 16))
    return keys
