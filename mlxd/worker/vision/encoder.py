"""The image encoder: a chat's images to placeholder tokens, pixels, and features for prefill.

Three stages, two threads. ``prepare`` decodes the images (PIL) and runs the checkpoint's
processor (resize, normalize, the placeholder tokens each image becomes) on a thread pool, off
the engine's MLX thread: a burst of large images never stalls a decode step. The vision tower
runs on the engine thread, lazily, when a prefill chunk first reaches an image's placeholders
(a prompt whose images all sit in a prefix-cache hit never runs it), one image at a time and
as many per step as the step's prefill budget buys (``encode_ahead``: the chunk stops before
the rest), so a burst of images stalls running streams about as long as a prompt chunk does;
``embeddings`` splices the features into that step's chunk's token embeddings at the placeholder
positions (and, for Qwen3-VL, ``deepstack`` hands the chunk's deepstack features to the
decoder). The features are dropped once the prompt's prefill is done; each image's are kept by
its digest in a bounded ``FeatureCache`` too, so a prompt whose image is only partly in the
prefix cache (its last placeholders past the last whole block), a later turn about it, or a
preempted sequence resuming, never runs the tower for it again.
"""

from __future__ import annotations

import io
import logging
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import numpy as np

from mlxd.errors import InvalidRequest
from mlxd.knobs import MAX_IMAGE_PIXELS
from mlxd.models.vision_layout import FEATURE_CACHE_BYTES
from mlxd.protocol.messages import ImageData
from mlxd.worker.sched import image_spans
from mlxd.worker.vision import deepstack
from mlxd.worker.vision.gemma4 import bidirectional_images
from mlxd.worker.vision.mrope import MRope, MRopeTextModel, prompt_positions
from mlxd.worker.vision.tiles import image_counts, last_run_marker

if TYPE_CHECKING:
    from mlxd.worker.sched.scheduler import PrefillChunk
    from mlxd.worker.sched.sequence import Sequence
    from mlxd.worker.vision.model import TextModel

log = logging.getLogger(__name__)

PREPARE_THREADS = 2  # image decoding and processing run beside the engine thread
# Narrower images are refused: processors take a side of 1 for the channel axis.
MIN_IMAGE_SIDE = 2
# Placeholder keys are negative (token ids are not): -(1 + the digest's first 60 bits).
_KEY_HEX_DIGITS = 15
# The processor's outputs besides the pixels that a family's merge takes (SmolVLM / Idefics3:
# which pixels of each tile are real; Pixtral: each image's size within the padded pixels),
# passed to ``get_input_embeddings`` as they come.
EXTRA_INPUTS = ("pixel_attention_mask", "image_sizes")


@dataclass(eq=False)
class PromptImages:
    """A prompt's images once prepared: their pixels, where their placeholders sit in the
    prompt (in feature order), and the vision tower's features (while prefill needs them)."""

    pixel_values: np.ndarray
    positions: np.ndarray  # (image tokens,) prompt positions, ascending
    digests: list[str]
    # (image tokens, hidden); Qwen3-VL's deepstack sets follow each token's own along the last
    # axis (hidden x (1 + deepstack layers)), so the feature cache keeps them per image too
    features: mx.array | None = None
    # Qwen-VL: each image's (time, height, width) in patches, the prompt's mRoPE positions
    # (3, prompt) and the offset of every position past them (``vision.mrope``).
    grid_thw: np.ndarray | None = None
    mrope: np.ndarray | None = None
    delta: int = 0
    # Images run through the tower ahead of the chunk that splices them (``encode_ahead``),
    # by index: a step encodes a bounded slice of a prompt's images, not all of them.
    parts: dict[int, mx.array] = field(default_factory=dict)
    # Images in several runs (SmolVLM's tiles, Pixtral's rows): each image's placeholder
    # count (``vision.tiles``), and the processor's other inputs to the merge (``EXTRA_INPUTS``).
    counts: list[int] | None = None
    inputs: dict[str, np.ndarray] = field(default_factory=dict)
    # Images whose tokens attend each other both ways (Gemma 4's ``use_bidirectional_attention:
    # vision``): each run of placeholders, [start, end), kept whole in one forward
    # (``sched.image_spans``); none for a causal model's.
    spans: list[tuple[int, int]] = field(default_factory=list)

    @property
    def sizes(self) -> list[int]:
        """Each image's placeholder count (the same for every image but Qwen-VL's and tiled
        ones)."""
        if self.counts is not None:
            return self.counts
        if self.grid_thw is not None:  # a token per merged patch group: in proportion
            patches = self.grid_thw.prod(axis=1)
            return [len(self.positions) * int(p) // int(patches.sum()) for p in patches]
        return [len(self.positions) // len(self.digests)] * len(self.digests)

    def owners(self, start: int, end: int) -> list[int]:
        """The images with a placeholder at prompt positions ``start .. end``, in order."""
        owner = np.repeat(np.arange(len(self.digests)), self.sizes)
        inside = (self.positions >= start) & (self.positions < end)
        return sorted({int(n) for n in owner[inside]})

    def first_position(self, n: int) -> int:
        """Image ``n``'s first placeholder position."""
        return int(self.positions[sum(self.sizes[:n])])

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
        self.image_token_id = _image_token_id(vlm.config)
        # Qwen-VL's positions (None: the family's positions are the cache offsets).
        self.mrope = MRope() if isinstance(text, MRopeTextModel) else None
        # Qwen3-VL: the decoder layers the tower's deepstack features go into (``deepstack``)
        self.deepstack_layers = _deepstack_layers(vlm.config)
        # Images in several runs (tiles, rows): what marks each one's last (``vision.tiles``).
        self.last_run = last_run_marker(vlm.config, processor.tokenizer)
        self.pool = ThreadPoolExecutor(PREPARE_THREADS, thread_name_prefix="images")
        self.counters = EncoderCounters()
        self.cache = FeatureCache()
        # what one patch through the tower costs in decoder tokens (``image_cost``)
        self.tower_ratio = _tower_ratio(vlm, text)
        self.patches_per_image = _patches_per_image(vlm.config)
        self.max_pixels = MAX_IMAGE_PIXELS.default  # --max-image-pixels
        self.both_ways = bidirectional_images(vlm.config)  # each image's tokens see each other
        from PIL import Image

        Image.MAX_IMAGE_PIXELS = None  # max_pixels is the limit (PIL's would refuse first)

    def prepare(self, text: str, images: list[ImageData]) -> Future[Prepared]:
        """Decode ``images`` and process them with the rendered chat ``text``, on the pool.
        The future raises ``InvalidRequest`` for bytes that are no image this model takes."""
        return self.pool.submit(self._prepare, text, images)

    def embeddings(
        self, tokens: mx.array, parts: list[tuple[Sequence, int, int]], right: bool = False
    ) -> mx.array | None:
        """The input embeddings of a left-padded prefill forward of ``tokens`` (B, W) (with
        ``right``: padded after each row's tokens), whose row ``b`` holds ``parts[b]``'s
        sequence's prefill positions ``start .. end``, with image features at their
        placeholders; None when no row reaches an image."""
        if not any(s.images is not None and s.images.overlaps(a, e) for s, a, e in parts):
            return None
        h = self.text.embed(tokens)
        width = tokens.shape[1]
        for b, (seq, start, end) in enumerate(parts):
            img = seq.images
            if img is None or not img.overlaps(start, end):
                continue
            picked, columns = _in_chunk(img, start, end, end - start if right else width)
            features = self._features(seq, img)
            spliced = features[mx.array(picked)][:, : h.shape[-1]]  # deepstack's lie past it
            h[b, mx.array(columns)] = spliced.astype(h.dtype)
        return h

    def encode_ahead(self, chunks: list[PrefillChunk], budget: int) -> list[PrefillChunk]:
        """Run the tower for the images this step's ``chunks`` reach, a bounded slice per step,
        so a burst of images stalls the running streams no longer than a prefill chunk does:
        images whose estimated cost (``image_cost``, in prompt tokens) fits ``budget``, at least
        one, each spliced in the step that encodes it (a prompt's text and its image in one
        forward). A chunk that reaches an image left for a later step stops before it; chunks
        left with no tokens wait (their rows stay prefilling)."""
        kept: list[PrefillChunk] = []
        spent = 0.0
        for chunk in chunks:
            end, spent = self._encode_for(chunk, budget, spent)
            if end > chunk.start:
                kept.append(chunk if end == chunk.end else replace(chunk, end=end))
        return kept

    def image_cost(self, img: PromptImages, n: int) -> float:
        """Image ``n``'s tower time in prompt tokens of the language model: the tower's weights
        times its patches, over the decoder layers' weights per token (attention inside the
        tower left out, as ``PrefillCost`` leaves it out of a short chunk)."""
        if img.grid_thw is not None:
            patches = int(img.grid_thw[n].prod())
        elif self.patches_per_image:
            patches = self.patches_per_image
        else:
            patches = img.sizes[n]
        return patches * self.tower_ratio

    def deepstack(self, width: int, parts: list[tuple[Sequence, int, int]]) -> dict[str, Any]:
        """Qwen3-VL: the deepstack arguments of the prefill forward ``embeddings`` made (its
        rows' image columns and their features, ``vision.deepstack``); none for other
        families or a forward without image tokens."""
        if not self.deepstack_layers:
            return {}
        mask = np.zeros((len(parts), width), dtype=bool)
        picked_features = []
        for b, (seq, start, end) in enumerate(parts):
            img = seq.images
            if img is None or not img.overlaps(start, end):
                continue
            picked, columns = _in_chunk(img, start, end, width)
            mask[b, columns] = True
            picked_features.append(self._features(seq, img)[mx.array(picked)])
        if not picked_features:
            return {}
        hidden = int(self.text.args.hidden_size)
        return deepstack.forward_inputs(mask, picked_features, hidden, self.deepstack_layers)

    def done_with(self, seq: Sequence) -> None:
        """``seq``'s prompt is prefilled: its features go (its pixels stay, for a recompute)."""
        if seq.images is not None:
            seq.images.features = None
            seq.images.parts.clear()

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
        digests = [i.digest for i in images]
        prompt_images = PromptImages(_pixels(out["pixel_values"]), positions, digests)
        if self.mrope is not None:
            self._add_mrope(prompt_images, ids, np.asarray(out["image_grid_thw"]))
        if self.last_run is not None:
            prompt_images.counts = image_counts(ids, positions, self.last_run)
        prompt_images.inputs = {k: np.asarray(out[k]) for k in EXTRA_INPUTS if k in out}
        if self.both_ways:
            prompt_images.spans = image_spans.runs(positions.tolist())
        sizes = prompt_images.sizes
        if sum(sizes) != len(positions) or len(sizes) != len(digests):
            raise InvalidRequest("the prompt's image placeholders do not match its images")
        return Prepared(ids, prompt_images, _keys(ids, prompt_images))

    def _add_mrope(self, img: PromptImages, ids: list[int], grid_thw: np.ndarray) -> None:
        """Qwen-VL: the images' grids and the prompt's positions (``mrope``)."""
        merge = int(self.vlm.config.vision_config.spatial_merge_size)
        img.grid_thw = grid_thw.reshape(-1, 3)
        img.mrope, img.delta = prompt_positions(ids, img.grid_thw, self.image_token_id, merge)

    def _features(self, seq: Sequence, img: PromptImages) -> mx.array:
        """The vision tower's output at every placeholder of ``seq``'s prompt, through the
        model's own merge (``get_input_embeddings``), so any family that splices at its
        placeholders is served as mlx-vlm serves it; from the feature cache when every image
        of the prompt is there."""
        if img.features is None and img.parts:  # encoded ahead (``encode_ahead``)
            return self._from_parts(img)
        if img.features is None:
            cached = self.cache.get(img.digests)
            img.features = mx.concatenate(cached) if cached else self._encode(seq, img)
        return img.features

    def _from_parts(self, img: PromptImages) -> mx.array:
        """The prompt's features from the images encoded ahead; an image not among them lies
        before this chunk (in a prefix hit or an earlier chunk): zeros, never read."""
        some = next(iter(img.parts.values()))
        return mx.concatenate(
            [
                img.parts.get(n, mx.zeros((size, some.shape[-1]), dtype=some.dtype))
                for n, size in enumerate(img.sizes)
            ]
        )

    def _encode_for(self, chunk: PrefillChunk, budget: int, spent: float) -> tuple[int, float]:
        """Where ``chunk`` may end this step (before its first image the budget leaves for a
        later step) and the step's cost spent, once the images it reaches went through the
        tower as far as ``budget`` allows: those are spliced in this very step."""
        img, end = chunk.seq.images, chunk.end
        if img is None or img.features is not None:
            return end, spent
        for n in img.owners(chunk.start, chunk.end):
            if self._ready(img, n):
                continue
            if spent and spent + self.image_cost(img, n) > budget:
                return min(end, img.first_position(n)), spent  # it and the rest: a later step
            spent += self._encode_one(chunk.seq, img, n)
            if img.features is not None:  # the family's images went through whole
                break
        return end, spent

    def _ready(self, img: PromptImages, n: int) -> bool:
        """Whether image ``n``'s features are at hand (encoded ahead, or in the cache)."""
        if n not in img.parts:
            cached = self.cache.get([img.digests[n]])
            if cached is not None:
                img.parts[n] = cached[0]
        return n in img.parts

    def _encode_one(self, seq: Sequence, img: PromptImages, n: int) -> float:
        """Image ``n`` through the tower alone, into ``img.parts``; its cost spent. A family
        whose pixels cannot be cut per image runs the prompt's images whole (``_encode``)."""
        one = _one_image(img, n, seq.prompt_ids, self.image_token_id)
        if one is None:
            img.features = self._encode(seq, img)
            return sum(self.image_cost(img, k) for k in range(len(img.digests)))
        ids, alone = one
        img.parts[n] = self._run_tower(ids, alone)
        return self.image_cost(img, n)

    def _encode(self, seq: Sequence, img: PromptImages) -> mx.array:
        return self._run_tower(seq.prompt_ids, img)

    def _run_tower(self, prompt_ids: list[int], img: PromptImages) -> mx.array:
        """The features at ``img``'s placeholders of the prompt ``prompt_ids``."""
        began = time.perf_counter()
        ids = mx.array([prompt_ids])
        # the mask as mlx-vlm's generate gives it (the processor's: one unpadded prompt);
        # Gemma 3's merge needs one, LLaVA's takes none
        mask = mx.ones(ids.shape, dtype=mx.int32)
        extra = {} if img.grid_thw is None else {"image_grid_thw": mx.array(img.grid_thw)}
        extra.update({k: mx.array(v) for k, v in img.inputs.items()})
        pixels = _tower_pixels(img.pixel_values)
        out = self.vlm.get_input_embeddings(ids, pixels, mask=mask, **extra)
        features: mx.array = out.inputs_embeds[0][mx.array(img.positions)]
        if self.deepstack_layers:  # each image token's deepstack features beside its own
            features = mx.concatenate([features, *out.deepstack_visual_embeds], axis=-1)
        mx.eval(features)  # the tower's time is measured here, not in the forward
        self.counters.encoded += len(img.digests)
        self.counters.seconds += time.perf_counter() - began
        start = 0
        for digest, size in zip(img.digests, img.sizes, strict=True):
            own = mx.contiguous(features[start : start + size])  # a slice would keep the whole
            mx.eval(own)
            self.cache.put(digest, own)
            start += size
        return features


def _pixels(values: Any) -> np.ndarray:
    """The processor's pixels as one array; images of different sizes (Gemma 4 keeps each one's
    aspect ratio) come as a list, kept as an array of objects, one image each."""
    if not isinstance(values, list):
        return np.asarray(values)
    each = np.empty(len(values), dtype=object)
    each[:] = [np.asarray(v) for v in values]
    return each


def _tower_pixels(pixels: np.ndarray) -> Any:
    """``pixels`` as the tower takes them: an array, or a list of differently sized images."""
    if pixels.dtype == object:
        return [mx.array(p) for p in pixels]
    return mx.array(pixels)


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


def _keys(ids: list[int], img: PromptImages) -> list[int]:
    """The prompt's prefix-cache keys: its ids, each image's placeholders replaced by a key of
    its digest, so blocks holding an image match only the same image."""
    keys = list(ids)
    owners = np.repeat(np.arange(len(img.digests)), img.sizes)
    for p, n in zip(img.positions.tolist(), owners.tolist(), strict=True):
        keys[p] = -(1 + int(img.digests[n][:_KEY_HEX_DIGITS], 16))
    return keys


def _one_image(
    img: PromptImages, n: int, prompt_ids: list[int], image_token_id: int
) -> tuple[list[int], PromptImages] | None:
    """Image ``n`` as a prompt of its own: the prompt's ids without the other images'
    placeholders, and its pixels (Qwen-VL: its patches' rows and grid); None when the pixels
    are not one row per image, or the merge takes more inputs than the pixels (a family that
    tiles an image or sizes it apart: SmolVLM, Pixtral, Llama 4 run a prompt's images at once)."""
    if img.counts is not None or img.inputs:
        return None
    start = sum(img.sizes[:n])
    others = set(np.delete(img.positions, np.s_[start : start + img.sizes[n]]).tolist())
    ids = [t for p, t in enumerate(prompt_ids) if p not in others]
    positions = np.array([p for p, t in enumerate(ids) if t == image_token_id])
    grid = None
    if img.grid_thw is not None:
        rows = img.grid_thw.prod(axis=1)
        first = int(rows[:n].sum())
        pixels = img.pixel_values[first : first + int(rows[n])]
        grid = img.grid_thw[n : n + 1]
    elif img.pixel_values.shape[0] == len(img.digests):
        pixels = img.pixel_values[n : n + 1]
    else:
        return None
    return ids, PromptImages(pixels, positions, [img.digests[n]], grid_thw=grid)


def _tower_ratio(vlm: Any, text: Any) -> float:
    """The vision tower's and projector's weights over the decoder layers' (1.0 unknown)."""
    from mlx.utils import tree_flatten

    def size(module: Any) -> int:
        if module is None:
            return 0
        leaves: Any = tree_flatten(module.parameters())  # (name, array) pairs
        return sum(int(p.size) for _, p in leaves)

    tower = size(getattr(vlm, "vision_tower", None))
    tower += size(getattr(vlm, "multi_modal_projector", None))
    decoder = sum(size(layer) for layer in text.layers)
    return tower / decoder if tower and decoder else 1.0


def _patches_per_image(config: Any) -> int:
    """Patches the tower sees per image at its fixed size (0: unknown, or sized per image)."""
    vision = getattr(config, "vision_config", None)
    size, patch = getattr(vision, "image_size", None), getattr(vision, "patch_size", None)
    if not isinstance(size, int) or not isinstance(patch, int) or patch <= 0:
        return 0
    return (size // patch) ** 2


def _in_chunk(img: PromptImages, start: int, end: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(which image tokens lie in prompt positions ``start .. end``, their columns in a row of
    ``width`` that holds those positions right-aligned)."""
    picked = np.nonzero((img.positions >= start) & (img.positions < end))[0]
    return picked, width - (end - start) + img.positions[picked] - start


def _deepstack_layers(config: Any) -> int:
    """How many deepstack feature sets the tower hands out (Qwen3-VL's; 0 for the rest)."""
    indexes = getattr(config.vision_config, "deepstack_visual_indexes", None)
    return len(indexes or [])


def _image_token_id(config: Any) -> int:
    """The placeholder token's id (LLaVA names it ``image_token_index``, Qwen-VL
    ``image_token_id``)."""
    index = getattr(config, "image_token_index", None)
    return int(config.image_token_id if index is None else index)
