"""The images `mlxd bench run --image-size` sends: valid PNGs, one of its own for every seed."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest

from mlxd.bench.images import draw, encode_png, png_data_url


def _decoded(url: str) -> bytes:
    head, data = url.split(",", 1)
    assert head == "data:image/png;base64"
    return base64.b64decode(data)


def test_a_data_url_is_a_png_of_the_size_asked() -> None:
    image = pytest.importorskip("PIL.Image")
    picture = image.open(io.BytesIO(_decoded(png_data_url(48, 7))))
    assert picture.size == (48, 48) and picture.mode == "RGB"
    assert (np.asarray(picture) == draw(48, 7)).all()


def test_seeds_give_different_images_and_the_same_seed_the_same() -> None:
    assert png_data_url(32, 1) != png_data_url(32, 2)
    assert encode_png(draw(32, 1)) == encode_png(draw(32, 1))


def test_a_448_image_stays_small() -> None:
    assert len(_decoded(png_data_url(448, 3))) < 200_000  # tens of KB, not 600 KB of noise
