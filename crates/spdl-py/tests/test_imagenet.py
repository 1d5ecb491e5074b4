"""spdl_rs.source.imagenet: ImageNet, get_mappings, parse_wnid.

The expected orders and messages were produced by the same calls on SPDL 0.8.0's ``spdl.source.imagenet``;
they are hard-coded so that the suite runs without SPDL.
"""

import re

import pytest

from spdl_rs.source import IterableWithShuffle
from spdl_rs.source.imagenet import ImageNet, get_mappings, parse_wnid


@pytest.fixture
def root(tmp_path):
    for split, wnid in [("train", "n01440764"), ("train", "n15075141"), ("val", "n03709823")]:
        d = tmp_path / split / wnid
        d.mkdir(parents=True, exist_ok=True)
        for i in range(3):
            (d / f"{wnid}_{i}.JPEG").write_bytes(b"")
    (tmp_path / "train" / "n01440764" / "x.jpeg").write_bytes(b"")  # not *.JPEG: not listed
    return tmp_path


def rel(root, items):
    return [str(p.relative_to(root)) for p, _ in items]


TRAIN = [
    "train/n01440764/n01440764_0.JPEG",
    "train/n01440764/n01440764_1.JPEG",
    "train/n01440764/n01440764_2.JPEG",
    "train/n15075141/n15075141_0.JPEG",
    "train/n15075141/n15075141_1.JPEG",
    "train/n15075141/n15075141_2.JPEG",
]


def test_mappings():
    m = get_mappings()
    assert len(m) == 1000
    assert sorted(m.values()) == list(range(1000))
    assert list(m) == sorted(m)
    assert m["n01440764"] == 0
    assert m["n03709823"] == 636
    assert m["n15075141"] == 999
    assert all(re.fullmatch(r"n\d{8}", k) for k in m)
    m["n01440764"] = 5
    assert get_mappings()["n01440764"] == 0  # a new dict each call


def test_parse_wnid():
    assert parse_wnid("train/n01440764/n01440764_10026.JPEG") == "n01440764"
    assert parse_wnid("xn123456789y/n00000001") == "n12345678"


@pytest.mark.parametrize("s", ["abc", "n1234567", ""])
def test_parse_wnid_none(s):
    with pytest.raises(ValueError, match=f"^{re.escape(f'The given string does not contain WNID: {s}')}$"):
        parse_wnid(s)


def test_train_sorted_with_classes(root):
    src = ImageNet(root, "train")
    items = list(src)
    assert rel(root, items) == TRAIN
    assert [c for _, c in items] == [0, 0, 0, 999, 999, 999]
    assert list(src) == items


def test_val_is_default(root):
    items = list(ImageNet(str(root)))
    assert rel(root, items) == [f"val/n03709823/n03709823_{i}.JPEG" for i in range(3)]
    assert {c for _, c in items} == {636}


def test_shuffle_in_place_from_current_order(root):
    src = ImageNet(root, "train")
    src.shuffle(0)
    assert rel(root, src) == [TRAIN[i] for i in (4, 2, 1, 0, 5, 3)]
    src.shuffle(1)  # shuffles the already shuffled order, as SPDL does
    assert rel(root, src) == [TRAIN[i] for i in (1, 0, 3, 4, 5, 2)]


def test_is_iterable_with_shuffle(root):
    assert isinstance(ImageNet(root, "train"), IterableWithShuffle)


def test_bad_split(root):
    with pytest.raises(ValueError, match=re.escape("`split` must be one of ['train', 'val']")):
        ImageNet(root, "test")


def test_unknown_wnid(root):
    d = root / "val" / "n00000000"
    d.mkdir()
    (d / "a.JPEG").write_bytes(b"")
    with pytest.raises(KeyError, match="n00000000"):
        list(ImageNet(root))


def test_path_without_wnid(root):
    d = root / "train" / "nothing"
    d.mkdir()
    (d / "a.JPEG").write_bytes(b"")
    with pytest.raises(ValueError, match="The given string does not contain WNID: .*nothing/a.JPEG"):
        list(ImageNet(root, "train"))


def test_missing_root(tmp_path):
    assert list(ImageNet(tmp_path / "missing")) == []
