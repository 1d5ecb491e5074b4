"""spdl_rs.io's host/device memory names (SPDL 0.8.0's transfer_buffer, cpu_storage, cuda_config, ...), on
spdl-cuda: argument checks, CPU storage, the typed error of each call that needs a GPU on a machine without one,
the nested-batch walk of transfer_tensor_*, and, where a GPU is present, real round trips."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
import warnings
from collections import defaultdict, namedtuple
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

import spdl_rs
import spdl_rs.io as io
from spdl_rs.io import _cuda

pytestmark = pytest.mark.skipif(not _cuda.HAS_CUDA, reason="spdl_rs built without the `cuda` feature")

GPU = _cuda.HAS_CUDA and _cuda._device_count() > 0
no_gpu = pytest.mark.skipif(GPU, reason="checks the behaviour without a GPU")
needs_gpu = pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch


# --- names and signatures ---------------------------------------------------------------------------------


def test_names_resolve_through_spdl_rs_io() -> None:
    for name in (
        "transfer_tensor", "transfer_tensor_h2d", "transfer_tensor_d2h", "transfer_buffer", "transfer_buffer_cpu",
        "cpu_storage", "CPUStorage", "CUDAConfig", "cuda_config", "CUDABuffer",
    ):
        assert getattr(io, name) is getattr(_cuda, name), name
    assert issubclass(_cuda.CUDAUnavailableError, RuntimeError)


def test_signatures_follow_spdl() -> None:
    def params(fn: Any) -> list[tuple[str, Any, Any]]:
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]

    P, K, POK = inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD
    empty = inspect.Parameter.empty
    assert params(io.transfer_tensor_h2d) == [("batch", P, empty), ("num_caches", K, 4)]
    assert params(io.transfer_tensor) == [("batch", P, empty), ("num_caches", K, 4)]
    assert params(io.transfer_tensor_d2h) == [
        ("batch", P, empty), ("device", K, None), ("stream", K, None), ("producer_event", K, None),
    ]
    assert params(io.transfer_buffer) == [("buffer", POK, empty), ("device_config", K, empty)]
    assert params(io.transfer_buffer_cpu) == [("buffer", POK, empty)]
    assert params(io.cpu_storage) == [("size", POK, empty), ("pin_memory", POK, True)]
    assert params(io.cuda_config) == [("device_index", POK, empty), ("stream", POK, 2), ("allocator", POK, None)]


def test_import_never_needs_a_gpu() -> None:
    code = (
        "import spdl_rs.io as io\n"
        "from spdl_rs.io import transfer_buffer, transfer_buffer_cpu, transfer_tensor, transfer_tensor_h2d, "
        "transfer_tensor_d2h, cpu_storage, CPUStorage, CUDAConfig, cuda_config, CUDABuffer\n"
        "print(io.cuda_config(0).device_index)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "0"


# --- CUDAConfig -------------------------------------------------------------------------------------------


def test_cuda_config_defaults_and_fields() -> None:
    cfg = io.cuda_config(1)
    assert isinstance(cfg, io.CUDAConfig)
    assert (cfg.device_index, cfg.stream, cfg.allocator) == (1, 0x2, None)
    assert "device_index=1" in repr(cfg)
    legacy = io.cuda_config(device_index=0, stream=0)
    assert legacy.stream == 0
    direct = io.CUDAConfig(3, stream=0x1234)
    assert (direct.device_index, direct.stream) == (3, 0x1234)


def test_cuda_config_keeps_a_pair_of_callables() -> None:
    def alloc(size: int, device: int, stream: int) -> int:
        return 0

    def delete(ptr: int) -> None:
        return None

    cfg = io.cuda_config(0, allocator=(alloc, delete))
    assert cfg.allocator == (alloc, delete)


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        ({"device_index": -1}, ValueError, "device_index must be >= 0"),
        ({"device_index": 0, "stream": -2}, ValueError, "stream must be >= 0"),
        ({"device_index": "0"}, TypeError, "device_index must be an int"),
        ({"device_index": True}, TypeError, "device_index must be an int"),
        ({"device_index": 0, "stream": 1.5}, TypeError, "stream must be an int"),
        ({"device_index": 0, "allocator": (print,)}, TypeError, "pair (allocate, delete)"),
        ({"device_index": 0, "allocator": (print, 3)}, TypeError, "pair (allocate, delete)"),
        ({"device_index": 0, "allocator": print}, TypeError, "pair (allocate, delete)"),
    ],
)
def test_cuda_config_rejects_bad_arguments(kwargs: dict[str, Any], error: type[Exception], words: str) -> None:
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        io.cuda_config(**kwargs)


# --- CPUStorage -------------------------------------------------------------------------------------------


def test_pageable_cpu_storage_works_without_a_gpu() -> None:
    storage = io.cpu_storage(4096, pin_memory=False)
    assert isinstance(storage, io.CPUStorage)
    assert (storage.size, storage.pinned) == (4096, False)
    view = storage.buffer
    assert isinstance(view, spdl_rs.Buffer)
    assert (view.shape, view.dtype, view.is_pinned) == ((4096,), "uint8", False)
    a = np.asarray(view)
    assert not a.any()  # zeroed
    a[:5] = [1, 2, 3, 4, 5]
    # Every view shares the same memory.
    assert np.asarray(storage.buffer)[:5].tolist() == [1, 2, 3, 4, 5]
    assert "size=4096" in repr(storage) and "pinned=False" in repr(storage)


def test_cpu_storage_views_keep_the_memory_alive() -> None:
    view = io.cpu_storage(16, pin_memory=False).buffer  # the storage object itself is gone
    a = np.asarray(view)
    a[:] = 7
    assert np.asarray(view).sum() == 7 * 16


@pytest.mark.parametrize("size", [0, -1])
@pytest.mark.parametrize("pin", [False, True])
def test_cpu_storage_size_must_be_positive(size: int, pin: bool) -> None:
    with pytest.raises(ValueError, match="`size` must be greater than 0."):
        io.cpu_storage(size, pin_memory=pin)


def test_cpu_storage_size_must_be_an_int() -> None:
    with pytest.raises(TypeError, match="size must be an int"):
        io.cpu_storage("16", pin_memory=False)  # type: ignore[arg-type]


# --- no GPU: a typed error at the call that needs one -------------------------------------------------------


@no_gpu
def test_pinned_cpu_storage_without_a_driver_is_a_typed_error() -> None:
    for _ in range(2):  # the driver probe is cached; the second call fails the same way
        with pytest.raises(_cuda.CUDAUnavailableError) as info:
            io.cpu_storage(1024)
        assert isinstance(info.value, RuntimeError)
        assert "cpu_storage(pin_memory=True)" in str(info.value)
        assert "CUDA" in str(info.value)


@no_gpu
@pytest.mark.parametrize(
    "make",
    [
        lambda: spdl_rs.Buffer.zeros([2, 3], "float32"),
        lambda: np.arange(6, dtype=np.int16).reshape(2, 3),
        lambda: io.cpu_storage(8, pin_memory=False),
    ],
    ids=["spdl_rs.Buffer", "numpy", "CPUStorage"],
)
def test_transfer_buffer_without_a_gpu_is_a_typed_error(make: Any) -> None:
    with pytest.raises(_cuda.CUDAUnavailableError, match="CUDA") as info:
        io.transfer_buffer(make(), device_config=io.cuda_config(0))
    assert isinstance(info.value, RuntimeError)


@no_gpu
def test_transfer_buffer_cpu_of_device_memory_without_a_gpu_is_a_typed_error() -> None:
    class FakeDeviceArray:
        __cuda_array_interface__ = {"shape": (1,), "typestr": "|u1", "data": (0, False), "version": 3}

    with pytest.raises(_cuda.CUDAUnavailableError, match="no device"):
        io.transfer_buffer_cpu(FakeDeviceArray())


@no_gpu
def test_transfer_tensor_h2d_without_a_gpu_is_a_typed_error() -> None:
    with pytest.raises(_cuda.CUDAUnavailableError, match="The local rank is larger than the number of available GPUs"):
        io.transfer_tensor_h2d({"x": [1, 2]})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(_cuda.CUDAUnavailableError):
            io.transfer_tensor([1])
    assert any(issubclass(w.category, FutureWarning) and "transfer_tensor_h2d" in str(w.message) for w in caught)


@no_gpu
def test_transfer_tensor_d2h_without_a_gpu_returns_the_batch() -> None:
    batch = {"a": [np.zeros(2)], "b": (1, "x")}
    assert io.transfer_tensor_d2h(batch) is batch
    assert io.transfer_tensor_d2h(batch, device="cuda:0") is batch
    torch = _torch()
    if torch is not None:
        tensors = {"t": torch.zeros(3)}
        assert io.transfer_tensor_d2h(tensors) is tensors


# --- argument checks that come before any GPU work -----------------------------------------------------------


def test_transfer_buffer_checks_its_arguments_first() -> None:
    buf = spdl_rs.Buffer.zeros([4])
    with pytest.raises(TypeError, match="device_config must be a CUDAConfig"):
        io.transfer_buffer(buf, device_config=0)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        io.transfer_buffer(buf, io.cuda_config(0))  # type: ignore[misc]  # keyword-only

    class FakeDeviceArray:
        __cuda_array_interface__: dict[str, Any] = {}

    with pytest.raises(TypeError, match="already in CUDA device memory"):
        io.transfer_buffer(FakeDeviceArray(), device_config=io.cuda_config(0))
    pair = (lambda size, dev, stream: 0, lambda ptr: None)
    with pytest.raises(ValueError, match=re.escape("cuda_config(allocator=...) is not supported")):
        io.transfer_buffer(buf, device_config=io.cuda_config(0, allocator=pair))
    with pytest.raises(ValueError, match=re.escape("cuda_config(allocator=...) is not supported")):
        io.transfer_buffer(np.zeros(3), device_config=io.cuda_config(0, allocator=pair))
    with pytest.raises(TypeError, match="unsupported dtype"):
        io.transfer_buffer(np.array(["a", "b"]), device_config=io.cuda_config(0))


def test_transfer_buffer_cpu_takes_cuda_buffers_only() -> None:
    for bad in (spdl_rs.Buffer.zeros([2]), np.zeros(2), "x"):
        with pytest.raises(TypeError, match="transfer_buffer_cpu takes a CUDABuffer"):
            io.transfer_buffer_cpu(bad)


def test_transfer_tensor_arguments() -> None:
    with pytest.raises(ValueError, match="num_caches must be >= 0"):
        io.transfer_tensor_h2d([], num_caches=-1)
    with pytest.raises(TypeError, match="num_caches must be an int"):
        io.transfer_tensor_h2d([], num_caches="2")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        io.transfer_tensor_h2d(batch=[])  # type: ignore[call-arg]  # positional-only, as in SPDL
    with pytest.raises(ValueError, match="device must be provided when stream is not None"):
        io.transfer_tensor_d2h([], stream=object())


# --- the nested-batch walk of transfer_tensor_* -------------------------------------------------------------
# spdl-cuda's mock backend is internal to its Rust tests, so the walk is checked here through the same
# `_recursive_apply` the transfers use, with a test-only leaf function in place of the device copy.


class _OnDevice:
    """Test-only: what `_fake_device_copy` turns an array leaf into."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array


def _fake_device_copy(obj: Any) -> Any:
    """Test-only stand-in for the per-leaf device copy: wraps numpy arrays, passes anything else through."""
    return _OnDevice(obj) if isinstance(obj, np.ndarray) else obj


Pair = namedtuple("Pair", ["image", "label"])


@dataclass
class Sample:
    image: Any
    meta: dict[str, Any]
    derived: Any = field(init=False, default=None)


def test_walk_rebuilds_every_container_type() -> None:
    img = np.arange(6).reshape(2, 3)
    counts: defaultdict[str, list[Any]] = defaultdict(list, {"n": [np.ones(1), 3]})
    sample = Sample(image=img, meta={"name": "a.jpg"})
    sample.derived = np.zeros(2)
    batch = {
        "list": [img, "text", 4],
        "tuple": (img, None),
        "pair": Pair(img, 7),
        "counts": counts,
        "sample": sample,
        "nested": [{"deep": (img,)}],
    }
    out = _cuda._recursive_apply(_fake_device_copy, batch)

    assert type(out) is dict and out is not batch
    assert isinstance(out["list"][0], _OnDevice) and out["list"][0].array is img
    assert out["list"][1:] == ["text", 4]
    assert type(out["tuple"]) is tuple and isinstance(out["tuple"][0], _OnDevice) and out["tuple"][1] is None
    assert type(out["pair"]) is Pair and isinstance(out["pair"].image, _OnDevice) and out["pair"].label == 7
    assert type(out["counts"]) is defaultdict and out["counts"].default_factory is list
    assert isinstance(out["counts"]["n"][0], _OnDevice) and out["counts"]["n"][1] == 3
    assert out["counts"]["missing"] == []  # the factory still works
    assert type(out["sample"]) is Sample and isinstance(out["sample"].image, _OnDevice)
    assert out["sample"].meta == {"name": "a.jpg"}
    assert isinstance(out["sample"].derived, _OnDevice)  # init=False fields are walked too
    assert isinstance(out["nested"][0]["deep"][0], _OnDevice)
    # The input is left as it was.
    assert batch["list"][0] is img and sample.image is img and counts["n"][0].shape == (1,)


def test_walk_of_a_bare_leaf_and_of_empty_containers() -> None:
    a = np.zeros(1)
    assert _cuda._recursive_apply(_fake_device_copy, a).array is a
    assert _cuda._recursive_apply(_fake_device_copy, "s") == "s"
    assert _cuda._recursive_apply(_fake_device_copy, []) == []
    assert _cuda._recursive_apply(_fake_device_copy, ()) == ()
    assert _cuda._recursive_apply(_fake_device_copy, {}) == {}


# --- with a GPU: real copies (skipped here) -----------------------------------------------------------------


@needs_gpu
def test_gpu_round_trip_of_numpy_and_buffers() -> None:
    cfg = io.cuda_config(0)
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    dev = io.transfer_buffer(a[:, ::-1], device_config=cfg)  # strided input
    assert isinstance(dev, io.CUDABuffer)
    cai = dev.__cuda_array_interface__
    assert (cai["shape"], cai["typestr"], cai["version"]) == ((2, 3, 4), "<f4", 3)
    assert cai["data"][0] != 0 and dev.__dlpack_device__() == (2, 0)
    back = io.transfer_buffer_cpu(dev)
    assert np.array_equal(np.asarray(back), a[:, ::-1])

    storage = io.cpu_storage(64)
    assert storage.pinned
    np.asarray(storage.buffer)[:] = np.arange(64, dtype=np.uint8)
    dev2 = io.transfer_buffer(storage.buffer, device_config=cfg)
    assert np.array_equal(np.asarray(io.transfer_buffer_cpu(dev2)), np.arange(64, dtype=np.uint8))

    torch = _torch()
    if torch is not None:
        t = torch.from_dlpack(dev)
        assert t.is_cuda and t.shape == (2, 3, 4)
        moved = io.transfer_tensor_h2d({"x": [torch.ones(3)]})
        assert moved["x"][0].is_cuda
        back_t = io.transfer_tensor_d2h(moved, device="cuda:0")
        assert not back_t["x"][0].is_cuda and back_t["x"][0].tolist() == [1.0, 1.0, 1.0]


@needs_gpu
def test_gpu_device_index_beyond_the_devices_is_a_typed_error() -> None:
    with pytest.raises(_cuda.CUDAUnavailableError, match="does not exist"):
        io.transfer_buffer(np.zeros(2), device_config=io.cuda_config(_cuda._device_count()))
