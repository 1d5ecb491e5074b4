"""spdl_rs on Ray Data: GIL-free batch decoding inside Ray's workers, and Ray's iterators as a pipeline source.

Two pieces, one for each side of a Ray Data job:

- :py:class:`ImageBatchDecoder`, a ``map_batches`` callable that decodes a column of encoded images (or paths)
  with :py:func:`spdl_rs.io.load_image_batch` (resize, center crop or random resized crop, optional
  normalization) into one ``[N, H, W, C]`` column, in Rust, without the GIL. An instance runs as Ray tasks; the
  class itself (with ``fn_constructor_kwargs``) runs in an actor pool.
- :py:class:`VideoClipDecoder`, the same for a column of videos: clips sampled from each (seeded) and decoded
  once per GOP by :py:func:`spdl_rs.io.load_clips`, into one ``[N, clips, T, H, W, C]`` column.
- :py:class:`RayDataSource`, which makes a ``ray.data.DataIterator`` (e.g. one of
  ``Dataset.streaming_split(n)``) the source of a :py:class:`spdl_rs.pipeline.Pipeline`, so that the trainer's
  pipeline does only the last steps (collate, pin, host-to-device copy).

.. code-block:: python

    import ray
    from spdl_rs.pipeline import PipelineBuilder
    from spdl_rs.ray import ImageBatchDecoder, RayDataSource

    ds = ray.data.read_binary_files(paths, include_paths=True)
    ds = ds.map_batches(ImageBatchDecoder(224, 224, transform="center-crop"), batch_size=32)
    pipeline = (
        PipelineBuilder()
        .add_source(RayDataSource(ds.iterator(), batch_size=32))
        .pipe(lambda batch: torch.from_numpy(batch["image"]).pin_memory())
        .add_sink(2)
        .build(num_threads=2)
    )

Ray is imported on first use: ``import spdl_rs.ray`` works without Ray installed, and what needs Ray raises an
``ImportError`` that says how to install it. See docs/scale-out.md for when to move to Ray, and for how
checkpoints compose with Ray's iterators.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from . import io

if TYPE_CHECKING:
    import numpy

__all__ = ["ImageBatchDecoder", "RayDataSource", "VideoClipDecoder", "import_ray"]

_LG = logging.getLogger(__name__)

_CHANNELS = {"rgb": 3, "rgb24": 3, "rgba": 4, "gray": 1, "gray8": 1}
_TRANSFORMS = ("resize", "center-crop", "random-resized-crop")
_MID_EPOCH = ("error", "skip", "restart")


def import_ray() -> Any:
    """The ``ray`` module, imported on first use.

    Raises:
        ImportError: Ray (with Ray Data: ``pip install "ray[data]"``) is not installed in this interpreter.
    """
    try:
        import ray
        import ray.data
    except ImportError as exc:
        raise ImportError(
            f"spdl_rs.ray needs Ray Data, which is not importable here ({exc}); install it with "
            '`pip install "ray[data]"` (Ray publishes no wheels for free-threaded CPython)'
        ) from exc
    return ray


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def _output_batch(
    who: str, batch: Mapping[str, Any], dec: Any, decoded: numpy.ndarray, failures: list[tuple[int, str, str]]
) -> dict[str, Any]:
    """The output batch of a decoder (``dec``: its ``column``, ``output_column``, ``keep_input``, ``strict``):
    with ``strict``, the first failed row (sorted) raises ``RuntimeError`` naming it; otherwise failed rows are
    dropped from every column and each is logged."""
    import numpy as np

    if failures and dec.strict:
        index, name, message = failures[0]
        more = f" (and {len(failures) - 1} more rows of this batch)" if len(failures) > 1 else ""
        raise RuntimeError(f"{who}: row {index} ({name}) failed to decode{more}: {message}")
    result = {name: values for name, values in batch.items() if dec.keep_input or name != dec.column}
    if failures:
        failed = {index for index, _name, _message in failures}
        keep = np.array([i not in failed for i in range(len(decoded))], dtype=bool)
        for index, name, message in failures:
            _LG.warning("%s: dropped row %d (%s): %s", who, index, name, message)
        decoded = decoded[keep]
        result = {name: np.asarray(values)[keep] for name, values in result.items()}
    result[dec.output_column] = decoded
    return result


class ImageBatchDecoder:
    """A Ray Data ``map_batches`` callable that decodes a column of images with spdl-rs.

    Each batch's ``column`` (encoded bytes, as ``ray.data.read_binary_files`` makes, or paths readable on the
    worker) is decoded and transformed by :py:func:`spdl_rs.io.load_image_batch` in one call that holds no GIL,
    into ``output_column``: a ``uint8`` (or, with ``normalize``, ``float32``) array ``[N, H, W, C]`` (or
    ``[N, C, H, W]``). The other columns pass through; ``column`` is dropped unless ``keep_input``.

    As Ray tasks (an instance) or in an actor pool (the class, with ``fn_constructor_kwargs``):

    .. code-block:: python

        ds = ray.data.read_binary_files(paths, include_paths=True)
        ds.map_batches(ImageBatchDecoder(224, 224), batch_size=32)
        ds.map_batches(ImageBatchDecoder, fn_constructor_kwargs={"width": 224, "height": 224},
                       batch_size=32, compute=ray.data.ActorPoolStrategy(size=4))

    Ray reserves one CPU per task or actor by default; to decode a batch on more threads, give
    ``num_threads=k`` here and ``num_cpus=k`` to ``map_batches``, so that Ray's accounting matches.

    Args:
        width, height: The output size of every image.
        column: The input column: encoded images (``bytes``) or paths (``str``).
        output_column: The column the decoded batch goes to.
        keep_input: Keep ``column`` in the output (default: dropped, so that the encoded bytes are not carried
            further through the object store).
        layout: ``"NHWC"`` or ``"NCHW"``.
        normalize: ``None`` (``uint8``), ``"imagenet"``, ``"unit"`` or ``(mean, std)`` (``float32``).
        pixel_format: ``"rgb"``, ``"rgba"`` or ``"gray"``.
        filter: The resize filter (``"bilinear"``, ``"nearest"``, ``"box"``, ``"hamming"``, ``"bicubic"``).
        transform: ``"resize"``, ``"center-crop"`` (ImageNet eval) or ``"random-resized-crop"`` (ImageNet train:
            a random resized crop and a horizontal flip half the time).
        seed: Seed of the random crops (with ``key_column``; change it per epoch for new crops).
        key_column: A column of integers (e.g. a row id) that seeds each row's crop with ``seed``: the same row
            gets the same crop on every worker and in every run. Without it, ``random-resized-crop`` draws a
            fresh random key per row (crops are then not reproducible).
        strict: ``True``: a row that fails to decode fails the batch with a ``RuntimeError`` that names it (Ray
            retries or fails the job, per its settings). ``False``: failed rows are dropped from the output and
            each is logged (loggers ``spdl_rs.io`` and ``spdl_rs.ray``, on the worker).
        name_column: A column that names each row in messages (default ``"path"``, as
            ``read_binary_files(include_paths=True)`` makes), when the batch has it.
        num_threads: Decoding threads per batch.

    Raises:
        ValueError: An invalid argument (checked here, on the driver, before Ray ships the callable).
    """

    def __init__(
        self,
        width: int,
        height: int,
        *,
        column: str = "bytes",
        output_column: str = "image",
        keep_input: bool = False,
        layout: Literal["NHWC", "NCHW"] = "NHWC",
        normalize: str | tuple[Sequence[float], Sequence[float]] | None = None,
        pixel_format: str = "rgb",
        filter: str = "bilinear",
        transform: Literal["resize", "center-crop", "random-resized-crop"] = "resize",
        seed: int = 0,
        key_column: str | None = None,
        strict: bool = True,
        num_threads: int = 1,
        name_column: str | None = "path",
    ) -> None:
        self.width = _positive_int("width", width)
        self.height = _positive_int("height", height)
        self.num_threads = _positive_int("num_threads", num_threads)
        if layout not in ("NHWC", "NCHW"):
            raise ValueError(f'layout must be "NHWC" or "NCHW", got {layout!r}')
        if pixel_format not in _CHANNELS:
            raise ValueError(f"pixel_format must be one of {sorted(_CHANNELS)}, got {pixel_format!r}")
        if transform not in _TRANSFORMS:
            raise ValueError(f"transform must be one of {list(_TRANSFORMS)}, got {transform!r}")
        for name, value in (("column", column), ("output_column", output_column)):
            if not isinstance(value, str) or not value:
                raise ValueError(f"{name} must be a non-empty string, got {value!r}")
        if key_column is not None and (not isinstance(key_column, str) or not key_column):
            raise ValueError(f"key_column must be a non-empty string or None, got {key_column!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        self.column = column
        self.output_column = output_column
        self.keep_input = bool(keep_input)
        self.layout = layout
        self.normalize = normalize
        self.pixel_format = pixel_format
        self.filter = filter
        self.transform = transform
        self.seed = seed
        self.key_column = key_column
        self.strict = bool(strict)
        self.name_column = name_column
        self._rng: Any = None

    def __repr__(self) -> str:
        return (
            f"ImageBatchDecoder({self.width}, {self.height}, column={self.column!r}, "
            f"output_column={self.output_column!r}, transform={self.transform!r})"
        )

    def _empty(self) -> numpy.ndarray:
        import numpy as np

        c = _CHANNELS[self.pixel_format]
        shape = (0, self.height, self.width, c) if self.layout == "NHWC" else (0, c, self.height, self.width)
        return np.zeros(shape, dtype=np.uint8 if self.normalize is None else np.float32)

    def _keys(self, batch: Mapping[str, Any], n: int) -> list[int] | None:
        import numpy as np

        if self.key_column is not None:
            if self.key_column not in batch:
                raise KeyError(f"ImageBatchDecoder: key_column {self.key_column!r} is not in the batch "
                               f"(columns: {sorted(batch)})")
            keys = np.asarray(batch[self.key_column])
            if keys.dtype.kind not in "iu" or (keys.size and int(keys.min()) < 0):
                raise ValueError(f"ImageBatchDecoder: key_column {self.key_column!r} must hold non-negative "
                                 f"integers, got dtype {keys.dtype}")
            return [int(k) for k in keys]
        if self.transform != "random-resized-crop":
            return None
        if self._rng is None:
            self._rng = np.random.default_rng()
        return [int(k) for k in self._rng.integers(0, 2**63 - 1, size=n, dtype=np.int64)]

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """Decodes one batch (a dict of columns, Ray's ``batch_format="numpy"``); returns the output batch.

        Raises:
            TypeError: The batch is not a dict of columns (use ``batch_format="numpy"``) or ``column`` holds
                something other than bytes and paths.
            KeyError: ``column`` (or ``key_column``) is not in the batch.
            RuntimeError: With ``strict``, a row failed to decode; the message names it (by ``name_column``
                when the batch has it, else by its path or its index).
        """
        import numpy as np

        if not isinstance(batch, Mapping):
            raise TypeError(
                f"ImageBatchDecoder takes a dict of columns (map_batches(..., batch_format='numpy')), "
                f"got {type(batch).__name__}"
            )
        if self.column not in batch:
            raise KeyError(f"ImageBatchDecoder: column {self.column!r} is not in the batch (columns: {sorted(batch)})")
        items = list(batch[self.column])
        n = len(items)
        for i, item in enumerate(items):
            if not isinstance(item, (bytes, bytearray, memoryview, str)):
                raise TypeError(
                    f"ImageBatchDecoder: row {i} of column {self.column!r} is {type(item).__name__}; "
                    "expected encoded bytes or a path"
                )
        keys = self._keys(batch, n)
        failures: list[tuple[int, str, str]] = []
        if n == 0:
            images = self._empty()
        else:
            # Never strict inside: a failure is reported here, by the row's name (a path column), which the
            # decoder does not see when it is given bytes.
            out = io.load_image_batch(
                items, self.width, self.height, layout=self.layout, normalize=self.normalize,
                pixel_format=self.pixel_format, filter=self.filter, strict=False,
                num_threads=self.num_threads, return_info=True, transform=self.transform, seed=self.seed, keys=keys,
            )
            buffer, info = out if isinstance(out, tuple) else (out, {"failures": []})
            images = np.asarray(buffer)
            names = batch.get(self.name_column) if self.name_column is not None else None
            for index, item, message in info.get("failures", []):
                name = str(names[index]) if names is not None else item
                failures.append((int(index), name, message))
        return _output_batch("ImageBatchDecoder", batch, self, images, failures)


_CLIP_SAMPLERS = ("random_indices", "regular_indices", "random_timestamps", "regular_timestamps")


class VideoClipDecoder:
    """A Ray Data ``map_batches`` callable that decodes clips from a column of videos with spdl-rs.

    Each row's video (encoded bytes, as ``ray.data.read_binary_files`` makes, or a path readable on the worker)
    gives ``num_clips`` clips of ``num_frames`` frames, placed by ``sampler`` and decoded by
    :py:func:`spdl_rs.io.load_clips` (each GOP once for every clip that needs it, without the GIL) into
    ``output_column``: a ``uint8`` array ``[N, num_clips, num_frames, H, W, C]``.

    .. code-block:: python

        ds = ray.data.read_binary_files(video_paths, include_paths=True)
        ds = ds.map_batches(VideoClipDecoder(4, 16, width=112, height=112, key_column="id"), batch_size=8)

    Args:
        num_clips, num_frames: Clips per video and frames per clip.
        width, height: The output frame size (needed: every row must have the same shape).
        sampler: ``"random_indices"`` (default), ``"regular_indices"``, ``"random_timestamps"`` or
            ``"regular_timestamps"``.
        stride: Frames between a clip's frames (``1``: consecutive).
        seed: Seed of the random samplers (change it per epoch for new clips).
        key_column: A column of non-negative integers (e.g. a row id) mixed into each row's seed: the same row
            gets the same clips on every worker and in every run. Without it, every row uses ``seed`` alone.
        policy: A clip past the end of a short video: ``"repeat_last"`` (default), ``"wrap"`` or ``"error"``.
        column, output_column, keep_input, strict, name_column: As :py:class:`ImageBatchDecoder`.
        num_threads: Videos decoded at once per batch.

    Raises:
        ValueError: An invalid argument (checked here, on the driver).
    """

    def __init__(
        self,
        num_clips: int,
        num_frames: int,
        *,
        width: int,
        height: int,
        sampler: str = "random_indices",
        stride: int = 1,
        seed: int = 0,
        key_column: str | None = None,
        policy: Literal["repeat_last", "wrap", "error"] = "repeat_last",
        pix_fmt: str = "rgb24",
        column: str = "bytes",
        output_column: str = "clips",
        keep_input: bool = False,
        strict: bool = True,
        num_threads: int = 1,
        name_column: str | None = "path",
    ) -> None:
        self.num_clips = _positive_int("num_clips", num_clips)
        self.num_frames = _positive_int("num_frames", num_frames)
        self.width = _positive_int("width", width)
        self.height = _positive_int("height", height)
        self.stride = _positive_int("stride", stride)
        self.num_threads = _positive_int("num_threads", num_threads)
        if sampler not in _CLIP_SAMPLERS:
            raise ValueError(f"sampler must be one of {list(_CLIP_SAMPLERS)}, got {sampler!r}")
        if policy not in ("repeat_last", "wrap", "error"):
            raise ValueError(f'policy must be "repeat_last", "wrap" or "error", got {policy!r}')
        if pix_fmt not in ("rgb24", "gray"):
            raise ValueError(f'pix_fmt must be "rgb24" or "gray", got {pix_fmt!r}')
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        self.sampler, self.policy, self.pix_fmt, self.seed = sampler, policy, pix_fmt, seed
        self.column, self.output_column, self.keep_input = column, output_column, bool(keep_input)
        self.key_column, self.strict, self.name_column = key_column, bool(strict), name_column

    def __repr__(self) -> str:
        return (
            f"VideoClipDecoder({self.num_clips}, {self.num_frames}, width={self.width}, height={self.height}, "
            f"sampler={self.sampler!r})"
        )

    def _decode(self, src: Any, seed: int, name: str) -> Any:
        fn = {
            "random_indices": io.clips_at_random_indices,
            "regular_indices": io.clips_at_regular_indices,
            "random_timestamps": io.clips_at_random_timestamps,
            "regular_timestamps": io.clips_at_regular_timestamps,
        }[self.sampler]
        extra: dict[str, Any] = {"seed": seed} if self.sampler.startswith("random") else {}
        if not isinstance(src, str):
            extra["name"] = name
        return fn(
            src, self.num_clips, self.num_frames, width=self.width, height=self.height, stride=self.stride,
            policy=self.policy, pix_fmt=self.pix_fmt, **extra,
        )

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """Decodes one batch (a dict of columns, ``batch_format="numpy"``); returns the output batch.

        Raises:
            TypeError, KeyError: As :py:class:`ImageBatchDecoder`.
            RuntimeError: With ``strict``, a row failed; the message names it.
        """
        import numpy as np
        from concurrent.futures import ThreadPoolExecutor

        if not isinstance(batch, Mapping):
            raise TypeError(f"VideoClipDecoder takes a dict of columns, got {type(batch).__name__}")
        if self.column not in batch:
            raise KeyError(f"VideoClipDecoder: column {self.column!r} is not in the batch (columns: {sorted(batch)})")
        items = list(batch[self.column])
        n = len(items)
        names_col = batch.get(self.name_column) if self.name_column is not None else None
        names = [str(names_col[i]) if names_col is not None else f"row {i}" for i in range(n)]
        if self.key_column is not None:
            if self.key_column not in batch:
                raise KeyError(f"VideoClipDecoder: key_column {self.key_column!r} is not in the batch")
            keys = [int(k) for k in np.asarray(batch[self.key_column])]
            seeds = [(self.seed * 1_000_003 + k) % (2**63) for k in keys]
        else:
            seeds = [self.seed] * n
        c = 3 if self.pix_fmt == "rgb24" else 1
        out = np.zeros((n, self.num_clips, self.num_frames, self.height, self.width, c), dtype=np.uint8)
        failures: list[tuple[int, str, str]] = []

        def one(i: int) -> None:
            item = items[i]
            if isinstance(item, np.ndarray):
                item = item.tobytes()
            try:
                out[i] = np.asarray(self._decode(item, seeds[i], names[i]))
            except (RuntimeError, ValueError, OSError) as e:
                failures.append((i, names[i], str(e)))

        with ThreadPoolExecutor(max_workers=min(self.num_threads, max(n, 1))) as pool:
            list(pool.map(one, range(n)))
        failures.sort()
        return _output_batch("VideoClipDecoder", batch, self, out, failures)


class RayDataSource:
    """A Ray Data iterator as the source of an spdl_rs pipeline: each iteration of this object is one epoch of
    ``iterator.iter_batches(...)`` (or ``iter_rows()``), read lazily.

    ``iterator`` is a ``ray.data.DataIterator`` (``Dataset.iterator()``, one of ``Dataset.streaming_split(n)``,
    or ``ray.train.get_dataset_shard(name)``) or a ``Dataset``. Back-pressure is kept end to end: the pipeline
    pulls a batch only when its queue has room, Ray prefetches at most ``prefetch_batches`` ahead of that, and
    Ray's streaming executor stops producing when its output is not consumed.

    .. code-block:: python

        shards = ds.streaming_split(world_size, equal=True)
        source = RayDataSource(shards[rank], batch_size=32)
        pipeline = (PipelineBuilder().add_source(source)
                    .pipe(collate).pipe(to_cuda).add_sink(2).build(num_threads=2))

    Checkpoints (:py:meth:`state_dict`): Ray's iterators cannot be resumed in the middle of an epoch, so a
    position is exact only at an epoch boundary. A mid-epoch state is refused by :py:meth:`load_state_dict`
    unless ``mid_epoch`` says what to do instead (see docs/scale-out.md).

    Args:
        iterator: A ``ray.data.DataIterator`` or ``ray.data.Dataset``.
        batch_size: Rows per batch (``None``: Ray's blocks as they come); ignored with ``rows``.
        batch_format: ``"numpy"`` (a dict of arrays), ``"pandas"``, ``"pyarrow"`` or ``"default"``.
        rows: Yield rows (``iter_rows()``) instead of batches.
        drop_last: Drop each epoch's last, incomplete batch.
        prefetch_batches: Batches Ray reads ahead of the pipeline.
        local_shuffle_buffer_size, local_shuffle_seed: Ray's local shuffle of ``iter_batches``.
        mid_epoch: What :py:meth:`load_state_dict` does with a state taken in the middle of an epoch:
            ``"error"`` (a ``ValueError``), ``"skip"`` (re-read the epoch and drop what was already yielded:
            exact only when the dataset's order is deterministic, see docs/scale-out.md) or ``"restart"``
            (re-read the epoch from its start: the rows already yielded come again).
    """

    def __init__(
        self,
        iterator: Any,
        *,
        batch_size: int | None = 256,
        batch_format: str = "numpy",
        rows: bool = False,
        drop_last: bool = False,
        prefetch_batches: int = 1,
        local_shuffle_buffer_size: int | None = None,
        local_shuffle_seed: int | None = None,
        mid_epoch: Literal["error", "skip", "restart"] = "error",
    ) -> None:
        import_ray()
        if not (hasattr(iterator, "iter_batches") and hasattr(iterator, "iter_rows")):
            raise TypeError(
                f"RayDataSource takes a ray.data.DataIterator or ray.data.Dataset, got {type(iterator).__name__}"
            )
        if batch_size is not None:
            _positive_int("batch_size", batch_size)
        if isinstance(prefetch_batches, bool) or not isinstance(prefetch_batches, int) or prefetch_batches < 0:
            raise ValueError(f"prefetch_batches must be a non-negative integer, got {prefetch_batches!r}")
        if mid_epoch not in _MID_EPOCH:
            raise ValueError(f"mid_epoch must be one of {list(_MID_EPOCH)}, got {mid_epoch!r}")
        self._iterator = iterator
        self._rows = bool(rows)
        self._kwargs: dict[str, Any] = dict(
            batch_size=batch_size, batch_format=batch_format, drop_last=bool(drop_last),
            prefetch_batches=prefetch_batches, local_shuffle_buffer_size=local_shuffle_buffer_size,
            local_shuffle_seed=local_shuffle_seed,
        )
        self._mid_epoch = mid_epoch
        self._lock = threading.Lock()
        self._epoch = 0  # epochs finished
        self._position = 0  # items (batches or rows) yielded in the current epoch
        self._skip = 0  # items to drop at the start of the next epoch (a restored "skip" state)
        self._generation = 0  # the iteration that owns the position; older ones end at their next item

    def __repr__(self) -> str:
        unit = "rows" if self._rows else f"batches of {self._kwargs['batch_size']}"
        return f"RayDataSource({unit}, epoch={self._epoch}, position={self._position})"

    @property
    def epoch(self) -> int:
        """Epochs finished so far (the number of the epoch an iteration reads next, or reads now)."""
        return self._epoch

    @property
    def position(self) -> int:
        """Items (batches, or rows with ``rows=True``) yielded in the current epoch."""
        return self._position

    def _epoch_iter(self) -> Iterator[Any]:
        if self._rows:
            return iter(self._iterator.iter_rows())
        return iter(self._iterator.iter_batches(**self._kwargs))

    def __iter__(self) -> Iterator[Any]:
        """One epoch of the iterator's items, from where a restored state says (see :py:meth:`load_state_dict`).

        A new iteration supersedes one left unfinished (a pipeline stopped mid-epoch): the old one ends at its
        next item, and the new one reads the epoch again from its start (the epoch counts once it is read to
        its end).
        """
        with self._lock:
            self._generation += 1
            generation = self._generation
            skip, self._skip = self._skip, 0
            self._position = 0
            epoch = self._epoch
        items = self._epoch_iter()
        try:
            for done in range(skip):
                if next(items, _END) is _END:
                    raise ValueError(
                        f"RayDataSource: the restored state skips {skip} items of epoch {epoch}, but the epoch has "
                        f"only {done} (the dataset changed since the checkpoint)"
                    )
            with self._lock:
                if generation == self._generation:
                    self._position = skip
            for item in items:
                with self._lock:
                    if generation != self._generation:
                        return  # superseded by a newer iteration or a restored state
                    self._position += 1
                yield item
            with self._lock:
                if generation == self._generation:
                    self._epoch += 1
                    self._position = 0
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    @property
    def deterministic_epoch_order(self) -> bool:
        """Whether an epoch is enumerated again in the same order: what a whole-pipeline checkpoint needs to
        resume mid-epoch by skipping delivered positions. True only with ``mid_epoch="skip"`` (the user vouches
        for a deterministic order); otherwise a pipeline's ``state_dict()`` in the middle of an epoch is refused."""
        return self._mid_epoch == "skip"

    def state_dict(self) -> dict[str, Any]:
        """The source's position: ``{"epoch": epochs finished, "position": items yielded in the current epoch}``.

        It is the position of what this source handed the pipeline; a pipeline checkpoint maps it to what was
        delivered. Exact to restore at an epoch boundary (``position == 0``) only.
        """
        with self._lock:
            return {"epoch": self._epoch, "position": self._position}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores a position from :py:meth:`state_dict`; the next iteration starts there.

        An iteration in progress ends at its next item.

        Raises:
            ValueError: The state is malformed, or taken in the middle of an epoch with ``mid_epoch="error"``
                (Ray's iterators cannot resume mid-epoch).
        """
        try:
            epoch, position = state["epoch"], state["position"]
        except (KeyError, TypeError):
            raise ValueError(
                f"RayDataSource: not a state of this source (expected 'epoch' and 'position'), got {state!r}"
            ) from None
        for name, value in (("epoch", epoch), ("position", position)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"RayDataSource: state {name!r} must be a non-negative integer, got {value!r}")
        if position and self._mid_epoch == "error":
            raise ValueError(
                f"RayDataSource: the state is in the middle of epoch {epoch} (after {position} items) and Ray's "
                "DataIterator cannot resume mid-epoch; checkpoint at an epoch boundary, or build the source with "
                "mid_epoch='skip' (exact only for a deterministic order) or mid_epoch='restart' (the epoch's first "
                "items come again)"
            )
        with self._lock:
            self._generation += 1
            self._epoch = epoch
            self._position = 0
            self._skip = position if self._mid_epoch == "skip" else 0


_END = object()
