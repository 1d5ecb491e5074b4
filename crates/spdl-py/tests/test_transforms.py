"""``load_image_batch``'s transforms: resize, ImageNet eval (center crop) and ImageNet train (random resized
crop + flip), seeded per item by ``keys``; on real JPEGs made by the ``ffmpeg`` CLI."""

import shutil
import subprocess

import numpy as np
import pytest

import spdl_rs.io as io
from spdl_rs.pipeline import PipelineBuilder


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory):
    if shutil.which("ffmpeg") is None:
        pytest.fail("the ffmpeg CLI is needed to make the test JPEGs")
    d = tmp_path_factory.mktemp("jpegs")
    paths = []
    for i, (w, h) in enumerate([(320, 240), (240, 360), (500, 375), (375, 500)]):
        p = d / f"{i}.jpg"
        subprocess.run(
            ["ffmpeg", "-hide_banner", "-loglevel", "error", "-y", "-f", "lavfi", "-i",
             f"testsrc2=size={w}x{h}:rate=1", "-frames:v", "1", "-q:v", "3", str(p)],
            check=True,
            timeout=60,
        )
        paths.append(str(p))
    return paths


def test_each_transform_gives_its_shape(jpegs):
    for transform in ["resize", "center-crop", "random-resized-crop"]:
        out = np.asarray(io.load_image_batch(jpegs, 64, 48, transform=transform, seed=1))
        assert out.shape == (4, 48, 64, 3), transform
        assert out.std() > 10, transform  # real pixels, not zero slots
    with pytest.raises(ValueError, match="random-resized-crop"):
        io.load_image_batch(jpegs, 64, 64, transform="crop")


def test_center_crop_is_the_center_of_the_resized_image(jpegs):
    # A 320x240 image: shorter side to 64 * 256 / 224 = 74 (98x74), then the centered 64x64.
    crop = np.asarray(io.load_image_batch(jpegs[:1], 64, 64, transform="center-crop")).astype(int)
    full = np.asarray(io.load_image_batch(jpegs[:1], 98, 74)).astype(int)
    left, top = (98 - 64 + 1) // 2, (74 - 64 + 1) // 2
    assert np.abs(crop[0] - full[0, top:top + 64, left:left + 64]).mean() < 8


def test_random_crops_follow_the_keys_not_the_batch(jpegs):
    keys = [10, 11, 12, 13]
    whole = np.asarray(io.load_image_batch(jpegs, 32, 32, transform="random-resized-crop", seed=4, keys=keys))
    for i in reversed(range(4)):
        one = np.asarray(io.load_image_batch([jpegs[i]], 32, 32, transform="random-resized-crop", seed=4,
                                             keys=[keys[i]], num_threads=1))
        assert np.array_equal(one[0], whole[i]), i
    other = np.asarray(io.load_image_batch(jpegs, 32, 32, transform="random-resized-crop", seed=5, keys=keys))
    assert not np.array_equal(other, whole)
    with pytest.raises(ValueError, match="keys"):
        io.load_image_batch(jpegs, 32, 32, transform="random-resized-crop", keys=[1])


def test_the_native_op_takes_the_transform(jpegs):
    from spdl_rs.io import ops

    p = (
        PipelineBuilder()
        .add_source(jpegs)
        .aggregate(2)
        .pipe(ops.load_image_batch(32, 32, transform="center-crop"))
        .add_sink(2)
        .build(num_threads=1)
    )
    with p.auto_stop():
        shapes = [np.asarray(b).shape for b in p]
    assert shapes == [(2, 32, 32, 3), (2, 32, 32, 3)]
