"""Images in several placeholder runs: each image's count ends at the run its marker marks."""

from __future__ import annotations

import numpy as np

from mlxd.worker.vision.tiles import LastRunMarker, image_counts

IMAGE, MARK, ROW, END, TEXT = 9, 7, 5, 3, 1


def _image(tiles: int, run: int) -> list[int]:
    """An image as SmolVLM's processor lays it out: its tiles' runs, then the global one's."""
    ids: list[int] = []
    for _ in range(tiles):
        ids += [ROW, *[IMAGE] * run]
    return [*ids, MARK, *[IMAGE] * run, TEXT]


def _counts(ids: list[int]) -> list[int]:
    positions = np.array([p for p, t in enumerate(ids) if t == IMAGE])
    return image_counts(ids, positions, LastRunMarker(MARK, before=True))


def test_each_image_has_its_own_count() -> None:
    ids = [TEXT, *_image(4, 3), TEXT, *_image(2, 3), *_image(0, 3)]
    assert _counts(ids) == [15, 9, 3]


def test_a_prompt_without_placeholders_has_no_images() -> None:
    assert _counts([TEXT, TEXT]) == []


def test_rows_end_with_the_end_marker() -> None:
    """Pixtral's layout: rows of placeholders, a break between rows, the end after the last."""
    first = [IMAGE, IMAGE, ROW, IMAGE, IMAGE, END]
    second = [IMAGE, IMAGE, IMAGE, END]
    ids = [TEXT, *first, TEXT, *second, TEXT]
    positions = np.array([p for p, t in enumerate(ids) if t == IMAGE])
    assert image_counts(ids, positions, LastRunMarker(END, before=False)) == [4, 3]
