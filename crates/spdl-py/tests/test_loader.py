"""``spdl_rs.loader.ImageLoader``: the recipe ``spdl bench`` runs, from Python: class folders give labels, a
broken image is counted and its slot zeroed while the rest loads, the same pixels as ``load_image_batch``, and
bad arguments refused before anything runs. Real JPEGs made by the ``ffmpeg`` CLI."""

import shutil
import subprocess

import numpy as np
import pytest

import spdl_rs.io as io
from spdl_rs.loader import ImageLoader


def _jpeg(path, w, h, seed):
    subprocess.run(
        ["ffmpeg", "-hide_banner", "-loglevel", "error", "-y", "-f", "lavfi", "-i",
         f"testsrc2=size={w}x{h}:rate=1", "-vf", f"hue=h={seed * 40}", "-frames:v", "1", "-q:v", "3", str(path)],
        check=True,
        timeout=60,
    )


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    if shutil.which("ffmpeg") is None:
        pytest.fail("the ffmpeg CLI is needed to make the test JPEGs")
    root = tmp_path_factory.mktemp("imagefolder")
    for c, cls in enumerate(["cat", "dog", "eel"]):
        (root / cls).mkdir()
        for i in range(4):
            _jpeg(root / cls / f"{i}.jpg", 160 + 16 * i, 120 + 8 * c, c * 4 + i)
    return root


def test_batches_and_labels_from_class_folders(dataset):
    loader = ImageLoader(str(dataset), batch_size=5, num_threads=2, size=32, epochs=2)
    assert loader.images_per_epoch == 12
    shapes, labels = [], []
    for images, batch_labels in loader:
        arr = np.asarray(images)
        assert arr.dtype == np.uint8 and arr.shape[1:] == (32, 32, 3)
        assert arr.shape[0] == len(batch_labels)
        shapes.append(arr.shape[0])
        labels.extend(batch_labels)
    assert sum(shapes) == 24
    assert sorted(labels) == sorted([0] * 8 + [1] * 8 + [2] * 8)
    assert loader.failed_images == 0
    assert "decode" in loader.stats_table()


def test_same_pixels_as_load_image_batch(dataset):
    paths = sorted(str(p) for p in dataset.rglob("*.jpg"))
    list_file = dataset / "list.txt"
    list_file.write_text("\n".join(p[len(str(dataset)) + 1:] for p in paths) + "\n")
    loader = ImageLoader(str(list_file), batch_size=len(paths), num_threads=1, size=48, transform="resize")
    (images, _), = list(loader)
    got = np.asarray(images)
    want = np.asarray(io.load_image_batch(paths, 48, 48, transform="resize"))
    # One batch, decoded in completion order of the reads: compare as a set of images.
    assert sorted(x.tobytes() for x in got) == sorted(x.tobytes() for x in want)


def test_a_broken_image_is_counted_and_the_rest_loads(dataset, tmp_path):
    good = sorted(dataset.rglob("*.jpg"))[:3]
    for i, p in enumerate(good):
        shutil.copy(p, tmp_path / f"{i}.jpg")
    (tmp_path / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a jpeg")
    loader = ImageLoader(str(tmp_path), batch_size=4, size=16)
    batches = list(loader)
    assert sum(len(labels) for _, labels in batches) == 4
    assert loader.failed_images == 1
    zero_slots = sum(int(not np.asarray(img).any()) for images, _ in batches for img in np.asarray(images))
    assert zero_slots == 1


def test_bad_arguments_are_refused(dataset, tmp_path):
    with pytest.raises(TypeError, match="unexpected keyword argument 'batchsize'"):
        ImageLoader(str(dataset), batchsize=4)
    with pytest.raises(ValueError, match="transform"):
        ImageLoader(str(dataset), transform="crop")
    with pytest.raises(ValueError, match="threads"):
        ImageLoader(str(dataset), num_threads=0)
    with pytest.raises(ValueError, match="no images"):
        ImageLoader(str(tmp_path))
    with pytest.raises(OSError):
        ImageLoader(str(tmp_path / "missing"))


def test_stop_ends_iteration(dataset):
    loader = ImageLoader(str(dataset), batch_size=2, size=16, epochs=50)
    it = iter(loader)
    next(it)
    loader.stop()
    assert list(it) == []
