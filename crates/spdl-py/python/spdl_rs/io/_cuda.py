"""SPDL's host/device memory names in :py:mod:`spdl_rs.io`, on spdl-cuda (the ``cuda`` cargo feature).

- :py:func:`cpu_storage` / :py:class:`CPUStorage`: host memory, page-locked from spdl-cuda's pinned pool
  (``pin_memory=True``) or ordinary (``pin_memory=False``, no GPU needed).
- :py:func:`cuda_config` / :py:class:`CUDAConfig`: the target device (made and checked without a GPU).
- :py:func:`transfer_buffer` copies an :py:class:`spdl_rs.Buffer` (or any numpy-compatible array) to the device
  and returns a :py:class:`CUDABuffer` (``__cuda_array_interface__`` and DLPack, so ``torch.as_tensor`` /
  ``torch.from_dlpack`` take it without a copy); :py:func:`transfer_buffer_cpu` copies one back into a new
  :py:class:`spdl_rs.Buffer`.
- :py:func:`transfer_tensor_h2d` / :py:func:`transfer_tensor_d2h` (and the deprecated
  :py:func:`transfer_tensor`) move the PyTorch tensors of a nested batch (lists, tuples, named tuples, dicts,
  ``defaultdict``, dataclasses) on a dedicated CUDA stream per thread, as SPDL's do.

Without a usable GPU (no CUDA driver, no device, an index beyond the devices, or a build without the ``cuda``
feature) each call that needs one raises :py:class:`CUDAUnavailableError`, a ``RuntimeError``; importing never
fails. ``cpu_storage(pin_memory=True)`` needs the driver too (pinned memory is the driver's): spdl-cuda has no
fallback to pageable memory, so neither does this. ``transfer_tensor_d2h`` returns its input unchanged when no
GPU is there, as SPDL's does.

Differences from SPDL, all deliberate: ``transfer_buffer`` copies on the device's dedicated copy stream and
returns once the copy is done, so the ``stream`` of a :py:class:`CUDAConfig` is kept but orders nothing (the
data is ready for every stream); a custom ``allocator`` is validated and refused at transfer time (device memory
comes from the device's stream-ordered pool); ``transfer_buffer_cpu`` takes the :py:class:`CUDABuffer`\\ s that
``transfer_buffer`` made (PyTorch CUDA tensors go back with ``transfer_tensor_d2h``); the CPU buffer type is
:py:class:`spdl_rs.Buffer`; ``cpu_storage`` refuses a size below 1 with ``ValueError`` (SPDL's wording,
SPDL raises ``RuntimeError``).
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import fields, is_dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from .. import _native
from .._native import Buffer

if TYPE_CHECKING:
    import torch

__all__ = [
    "CPUStorage",
    "CUDABuffer",
    "CUDAConfig",
    "CUDAUnavailableError",
    "cpu_storage",
    "cuda_config",
    "transfer_buffer",
    "transfer_buffer_cpu",
    "transfer_tensor",
    "transfer_tensor_d2h",
    "transfer_tensor_h2d",
]

_LG = logging.getLogger(__name__)

T = TypeVar("T")

HAS_CUDA: bool = bool(getattr(_native, "HAS_CUDA", False))
"""Whether this build has the ``cuda`` feature (CUDA itself is looked for at run time, by the calls)."""

_NOT_BUILT = "spdl_rs was built without the `cuda` feature (rebuild spdl-py with `--features cuda`)"

if HAS_CUDA:
    from .._native.io import CPUStorage, CUDABuffer, CUDAConfig, CUDAUnavailableError
else:

    class CUDAUnavailableError(RuntimeError):  # type: ignore[no-redef]
        """No usable CUDA GPU (here: a build without the ``cuda`` feature)."""

    class _Unbuilt:
        def __init__(self, *_args: object, **_kwargs: object) -> None:
            raise CUDAUnavailableError(f"{type(self).__name__}: {_NOT_BUILT}")

    class CUDAConfig(_Unbuilt):  # type: ignore[no-redef]
        """Needs a build with the ``cuda`` feature."""

    class CPUStorage(_Unbuilt):  # type: ignore[no-redef]
        """Needs a build with the ``cuda`` feature."""

    class CUDABuffer(_Unbuilt):  # type: ignore[no-redef]
        """Needs a build with the ``cuda`` feature."""


def _require_build(func: str) -> None:
    if not HAS_CUDA:
        raise CUDAUnavailableError(f"{func}: {_NOT_BUILT}")


def _device_count() -> int:
    """CUDA devices the driver reports (0 without a driver or without the ``cuda`` feature)."""
    return int(_native.io.cuda_device_count()) if HAS_CUDA else 0


def _check_int(func: str, name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{func}: {name} must be an int, got {type(value).__name__}")
    return value


###############################################################################
# Configuration and host memory
###############################################################################


def cuda_config(
    device_index: int,
    stream: int = 0x2,
    allocator: tuple[Callable[[int, int, int], int], Callable[[int], None]] | None = None,
) -> CUDAConfig:
    """The CUDA device (and SPDL's stream and allocator settings) for :py:func:`transfer_buffer`.

    Made and checked without a GPU; the device is opened by the first call that copies to it.

    Args:
        device_index: The device ordinal (``>= 0``).
        stream: The ``uintptr_t`` of a CUDA stream (default ``0x2``, the per-thread default stream; ``0`` the
            legacy one). Kept for SPDL compatibility: spdl_rs copies on the device's own copy stream and waits
            for the copy, so the data is ready on every stream, this one included.
        allocator: ``None``, or SPDL's pair ``(allocate(size, device_index, stream) -> address,
            delete(address))``. Checked here; :py:func:`transfer_buffer` refuses it (``ValueError``): device
            memory comes from the device's stream-ordered pool.

    Raises:
        TypeError: An argument of the wrong type (``allocator`` not a pair of callables).
        ValueError: A negative ``device_index`` or ``stream``.
        CUDAUnavailableError: A build without the ``cuda`` feature.
    """
    _require_build("cuda_config")
    _check_int("cuda_config", "device_index", device_index)
    _check_int("cuda_config", "stream", stream)
    return CUDAConfig(device_index, stream=stream, allocator=allocator)


def cpu_storage(size: int, pin_memory: bool = True) -> CPUStorage:
    """A block of ``size`` bytes of host memory, zeroed: page-locked (``pin_memory=True``, from spdl-cuda's
    pinned caching pool, so a copy to the GPU is a DMA that overlaps other work) or ordinary.

    ``storage.buffer`` views it as a writable 1-D ``uint8`` :py:class:`spdl_rs.Buffer`
    (``numpy.asarray(storage.buffer)`` to fill it); ``transfer_buffer(storage.buffer, device_config=...)`` sends
    it to a GPU without a host copy. The memory goes back to the pool when the storage and its views are gone.

    Args:
        size: Bytes to allocate (``> 0``).
        pin_memory: Page-locked memory from the CUDA driver (needs a CUDA driver and device: there is no
            fallback to pageable memory), or ordinary memory (works everywhere).

    Raises:
        TypeError: ``size`` is not an int.
        ValueError: ``size`` is below 1 (``"`size` must be greater than 0."``, SPDL's wording).
        CUDAUnavailableError: ``pin_memory=True`` and no CUDA driver or device (or no ``cuda`` feature).
        MemoryError: The memory could not be allocated.
    """
    _check_int("cpu_storage", "size", size)
    _require_build("cpu_storage")
    return _native.io.cuda_cpu_storage(size, pin_memory=bool(pin_memory))


###############################################################################
# Buffers: host <-> device
###############################################################################

_ALLOCATOR_REFUSED = (
    "transfer_buffer: cuda_config(allocator=...) is not supported by spdl_rs: device memory comes from the "
    "device's stream-ordered pool (cuMemAllocAsync); pass allocator=None"
)


def _as_array(buffer: object) -> Any:
    """``buffer`` (neither an :py:class:`spdl_rs.Buffer` nor a :py:class:`CPUStorage`) as a numpy array of a dtype
    spdl_rs buffers hold, in native byte order; checked before any GPU work."""
    try:
        import numpy
    except ImportError:
        raise TypeError(
            f"transfer_buffer takes an spdl_rs.Buffer (or, with numpy installed, an array); got {type(buffer).__name__}"
        ) from None
    try:
        array = numpy.asarray(buffer)
    except Exception as e:
        raise TypeError(f"transfer_buffer: cannot read {type(buffer).__name__} as an array: {e}") from e
    if array.dtype.hasobject or array.dtype.kind not in "uif" or array.dtype.name in ("float16", "uint64"):
        raise TypeError(
            f"transfer_buffer: unsupported dtype {array.dtype} (int8 to int64, uint8 to uint32, float32 and float64 are)"
        )
    if array.dtype.byteorder not in "=|":
        array = array.astype(array.dtype.newbyteorder("="))
    return array


def _pinned_copy(array: Any, device_index: int) -> Buffer:
    """A copy of ``array`` in the pinned pool of the device, so its copy to the device is a DMA."""
    import numpy

    pinned: Buffer = _native.io.cuda_pinned_buffer(list(array.shape), array.dtype.name, device_index)
    if array.size:
        numpy.asarray(pinned)[...] = array
    return pinned


def transfer_buffer(buffer: Any, *, device_config: CUDAConfig) -> CUDABuffer:
    """Copies host memory to the CUDA device of ``device_config`` and returns it as a :py:class:`CUDABuffer`.

    The copy runs on the device's dedicated copy stream with the GIL released and is complete when this returns
    (as SPDL's). A page-locked buffer (:py:func:`cpu_storage`, or a decoder's pinned output) is DMA'd in place;
    a pageable :py:class:`spdl_rs.Buffer` is staged through spdl-cuda's pinned pool; a numpy array is copied
    once into that pool.

    Args:
        buffer: An :py:class:`spdl_rs.Buffer` (SPDL's ``CPUBuffer``), a :py:class:`CPUStorage`, or an array
            numpy can read (integer, ``float32`` or ``float64``; any strides).
        device_config: From :py:func:`cuda_config`.

    Raises:
        TypeError: ``device_config`` is not a :py:class:`CUDAConfig`, or ``buffer`` is not host memory.
        ValueError: ``device_config`` carries a custom allocator.
        CUDAUnavailableError: No CUDA driver or device, or ``device_index`` is beyond the devices.
    """
    _require_build("transfer_buffer")
    if not isinstance(device_config, CUDAConfig):
        raise TypeError(
            f"transfer_buffer: device_config must be a CUDAConfig (spdl_rs.io.cuda_config(...)), "
            f"got {type(device_config).__name__}"
        )
    if isinstance(buffer, CUDABuffer) or hasattr(buffer, "__cuda_array_interface__"):
        raise TypeError("transfer_buffer: the buffer is already in CUDA device memory (it is not host memory)")
    if device_config.allocator is not None:
        raise ValueError(_ALLOCATOR_REFUSED)
    if isinstance(buffer, Buffer):
        host = buffer
    elif isinstance(buffer, CPUStorage):
        host = buffer.buffer
    else:
        array = _as_array(buffer)
        # Fail on a missing GPU before pinning memory for the array.
        _native.io.cuda_open(device_config.device_index)
        host = _pinned_copy(array, device_config.device_index)
    return _native.io.cuda_transfer_buffer(host, device_config=device_config)


def transfer_buffer_cpu(buffer: Any) -> Buffer:
    """Copies a :py:class:`CUDABuffer` back into a new host :py:class:`spdl_rs.Buffer` (GIL released; waits for
    the copy).

    Raises:
        CUDAUnavailableError: ``buffer`` has a ``__cuda_array_interface__`` but no GPU can be used here.
        TypeError: ``buffer`` is not a :py:class:`CUDABuffer` (PyTorch CUDA tensors: use
            :py:func:`transfer_tensor_d2h` or ``tensor.cpu()``).
    """
    _require_build("transfer_buffer_cpu")
    if isinstance(buffer, CUDABuffer):
        return _native.io.cuda_transfer_buffer_cpu(buffer)
    if hasattr(buffer, "__cuda_array_interface__") and _device_count() == 0:
        raise CUDAUnavailableError(
            "transfer_buffer_cpu: the buffer claims CUDA device memory, but the CUDA driver reports no device here"
        )
    raise TypeError(
        "transfer_buffer_cpu takes a CUDABuffer (made by spdl_rs.io.transfer_buffer); for PyTorch CUDA tensors use "
        f"transfer_tensor_d2h or tensor.cpu(); got {type(buffer).__name__}"
    )


###############################################################################
# Nested batches of PyTorch tensors
###############################################################################


def _recursive_apply(fn: Callable[[Any], Any], obj: T) -> T:
    """``obj`` rebuilt with ``fn`` applied to every leaf: containers (lists, tuples, named tuples, dicts and other
    mappings, ``defaultdict`` with its factory, dataclass instances with their ``init=False`` fields) are
    walked and rebuilt with their own type; anything else is a leaf."""
    kind = type(obj)
    if isinstance(obj, list):
        return kind(_recursive_apply(fn, item) for item in obj)  # type: ignore[call-arg]
    if isinstance(obj, tuple):
        if hasattr(obj, "_fields") and hasattr(obj, "_asdict"):  # a named tuple: rebuilt by field name
            return kind(**_recursive_apply(fn, obj._asdict()))
        return kind(_recursive_apply(fn, item) for item in obj)  # type: ignore[call-arg]
    if isinstance(obj, defaultdict):
        return kind(obj.default_factory, {k: _recursive_apply(fn, v) for k, v in obj.items()})  # type: ignore[call-arg]
    if isinstance(obj, Mapping):
        return kind({k: _recursive_apply(fn, v) for k, v in obj.items()})  # type: ignore[call-arg]
    if is_dataclass(obj) and not isinstance(obj, type):
        declared = fields(obj)
        rebuilt = kind(**{f.name: _recursive_apply(fn, getattr(obj, f.name)) for f in declared if f.init})
        for f in declared:
            if not f.init:
                setattr(rebuilt, f.name, _recursive_apply(fn, getattr(obj, f.name)))
        return rebuilt
    return fn(obj)


def _import_torch(func: str) -> Any:
    try:
        import torch
    except ImportError:
        raise ModuleNotFoundError(f"{func} moves torch.Tensor objects and needs PyTorch (pip install torch)") from None
    return torch


_THREAD_LOCAL = threading.local()


class _H2DTransfer:
    """One thread's host-to-device copier: a CUDA stream, and the last ``num_caches`` batches kept referenced
    (so PyTorch's caching allocator does not hand their memory to another stream's work too early)."""

    def __init__(self, torch: Any, device: torch.device, num_caches: int) -> None:
        self._torch = torch
        self._device = device
        self._stream = torch.cuda.Stream(device)
        self._recent: list[Any] = [None] * num_caches

    def __call__(self, batch: T) -> T:
        torch = self._torch
        pinned: list[Any] = []  # the page-locked copies, alive until the stream is synchronised

        def to_device(obj: Any) -> Any:
            if isinstance(obj, torch.Tensor) and obj.is_cpu:
                staged = obj.pin_memory()
                pinned.append(staged)
                return staged.to(self._device, non_blocking=True)
            return obj

        with torch.cuda.stream(self._stream):
            moved = _recursive_apply(to_device, batch)
        self._stream.synchronize()
        self._recent.append(moved)
        self._recent.pop(0)
        return moved


def _local_rank() -> int:
    raw = os.environ.get("LOCAL_RANK", "0")
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"LOCAL_RANK must be an integer, got {raw!r}") from None


def _h2d_transfer(func: str, num_caches: int) -> _H2DTransfer:
    existing = getattr(_THREAD_LOCAL, "h2d", None)
    if existing is not None:
        return existing
    rank = _local_rank()
    count = _device_count()
    if rank >= count:
        raise CUDAUnavailableError(
            f"{func}: The local rank is larger than the number of available GPUs. (LOCAL_RANK={rank}, "
            f"{count} CUDA device(s) found{'' if HAS_CUDA else '; ' + _NOT_BUILT})"
        )
    torch = _import_torch(func)
    device = torch.device(f"cuda:{rank}")
    _LG.info("Creating transfer stream on %s", device)
    transfer = _H2DTransfer(torch, device, num_caches)
    _THREAD_LOCAL.h2d = transfer
    return transfer


def _check_num_caches(func: str, num_caches: object) -> int:
    n = _check_int(func, "num_caches", num_caches)
    if n < 0:
        raise ValueError(f"{func}: num_caches must be >= 0, got {n}")
    _native._check_count("num_caches", n, 0, _native.ARG_LIMITS["threads"])
    return n


def transfer_tensor_h2d(batch: T, /, *, num_caches: int = 4) -> T:
    """Moves the CPU ``torch.Tensor``\\ s of ``batch`` to CUDA on this thread's own stream.

    The first call in a thread creates a CUDA stream for it on device ``cuda:$LOCAL_RANK`` (``0`` if unset) and
    keeps it. Each call walks ``batch`` (lists, tuples, named tuples, dicts, ``defaultdict``, dataclasses),
    copies each CPU tensor to page-locked memory (``pin_memory()``), queues its copy to the device
    (``.to(device, non_blocking=True)``) on that stream, then waits for the stream. Called from a background
    thread (a pipeline stage), the copies overlap the model's work on the main thread. Other leaves are
    returned as they are.

    Args:
        batch: A tensor, or containers of tensors.
        num_caches: How many recent output batches to keep referenced, which guards against PyTorch's caching
            allocator reusing their memory while another stream still reads it.

    Returns:
        ``batch`` rebuilt with the same container types, its CPU tensors on the GPU.

    Raises:
        CUDAUnavailableError: No CUDA device for ``LOCAL_RANK`` (SPDL's "The local rank is larger than the
            number of available GPUs.").
        ModuleNotFoundError: PyTorch is not installed.
    """
    n = _check_num_caches("transfer_tensor_h2d", num_caches)
    return _h2d_transfer("transfer_tensor_h2d", n)(batch)


def transfer_tensor(batch: T, /, *, num_caches: int = 4) -> T:
    """Deprecated (as in SPDL 0.8.0): :py:func:`transfer_tensor_h2d`, after a ``FutureWarning``."""
    warnings.warn(
        "transfer_tensor is deprecated; use transfer_tensor_h2d instead.",
        FutureWarning,
        stacklevel=2,
    )
    return transfer_tensor_h2d(batch, num_caches=num_caches)


class _D2HTransfer:
    """Device-to-host copies of the tensors of one device, on one stream."""

    def __init__(self, torch: Any, device: torch.device, stream: torch.cuda.Stream) -> None:
        self._torch = torch
        self._device = device
        self._stream = stream

    def __call__(self, batch: T, producer_event: torch.cuda.Event) -> T:
        torch = self._torch
        started = False

        def to_host(obj: Any) -> Any:
            nonlocal started
            if not isinstance(obj, torch.Tensor) or obj.device != self._device:
                return obj
            if not started:
                # Copy only once the producer's work on the batch is done.
                self._stream.wait_event(producer_event)
                started = True
            return obj.to("cpu", non_blocking=True)

        try:
            with torch.cuda.stream(self._stream):
                moved = _recursive_apply(to_host, batch)
        except BaseException as walk_error:
            if started:
                try:
                    self._stream.synchronize()
                except Exception as sync_error:
                    raise sync_error from walk_error
            raise
        if not started:
            return batch
        self._stream.synchronize()
        return moved


def _cuda_device(torch: Any, device: Any) -> Any:
    """``device`` as a CUDA ``torch.device`` with an index that exists (``None``: ``cuda:$LOCAL_RANK``)."""
    if device is None:
        resolved = torch.device("cuda", _local_rank())
    else:
        resolved = torch.device(device)
        if resolved.type != "cuda":
            raise ValueError(f"Expected a CUDA device, but received {resolved}.")
        if resolved.index is None:
            resolved = torch.device("cuda", torch.cuda.current_device())
    count = torch.cuda.device_count()
    if resolved.index is None or not 0 <= resolved.index < count:
        raise RuntimeError(f"CUDA device index {resolved.index} is invalid for {count} devices.")
    return resolved


def transfer_tensor_d2h(
    batch: T,
    /,
    *,
    device: Any = None,
    stream: Any = None,
    producer_event: Any = None,
) -> T:
    """Moves the ``torch.Tensor``\\ s of ``batch`` that live on one CUDA device to the CPU, on a dedicated stream.

    Walks ``batch`` like :py:func:`transfer_tensor_h2d`, queues each tensor of ``device`` to the CPU
    (``.to("cpu", non_blocking=True)``, which gives page-locked CPU tensors) on the stream, and waits for the
    stream before returning. The copies start once ``producer_event`` has completed; by default an event is
    recorded on the calling thread's current stream of ``device`` (record one on the producing thread and pass
    it when calling from another thread). Tensors of other devices and other leaves are returned as they are.

    Args:
        batch: A tensor, or containers of tensors.
        device: The CUDA device to move tensors from (``torch.device``, ``"cuda:1"``, ...); ``None``:
            ``cuda:$LOCAL_RANK`` (``cuda:0`` if unset).
        stream: A ``torch.cuda.Stream`` of ``device`` to copy on (then ``device`` is required); ``None``: a
            stream per thread and device, created on first use and kept.
        producer_event: A ``torch.cuda.Event`` marking when the tensors are ready.

    Returns:
        ``batch`` rebuilt with its tensors of ``device`` on the CPU; ``batch`` itself when it holds none, or when
        no CUDA device is available (as SPDL's).

    Raises:
        ValueError: ``stream`` without ``device``, a ``device`` that is not CUDA, or a stream of another device.
        RuntimeError: The device index does not exist.
    """
    if stream is not None and device is None:
        raise ValueError("device must be provided when stream is not None")
    if _device_count() == 0:
        return batch
    try:
        import torch
    except ImportError:
        return batch  # no PyTorch, so no PyTorch tensor to move
    if not torch.cuda.is_available():
        return batch
    resolved = _cuda_device(torch, device)
    if stream is not None and stream.device != resolved:
        raise ValueError(f"The transfer stream is on {stream.device}, not the requested {resolved}.")
    if producer_event is None:
        producer_event = torch.cuda.Event()
        producer_event.record(torch.cuda.current_stream(resolved))
    if stream is not None:
        return _D2HTransfer(torch, resolved, stream)(batch, producer_event)
    per_device: dict[Any, _D2HTransfer] = getattr(_THREAD_LOCAL, "d2h", None) or {}
    _THREAD_LOCAL.d2h = per_device
    transfer = per_device.get(resolved)
    if transfer is None:
        _LG.info("Creating D2H transfer handler on %s", resolved)
        transfer = per_device[resolved] = _D2HTransfer(torch, resolved, torch.cuda.Stream(resolved))
    return transfer(batch, producer_event)
