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

import threading
from collections.abc import Iterator, Mapping
from typing import Any, Literal

from ._native.ray import ImageBatchDecoder

try:
    from ._native.ray import VideoClipDecoder
except ImportError:  # a build without the `ffmpeg` feature decodes no video
    pass

__all__ = ["ImageBatchDecoder", "RayDataSource", "VideoClipDecoder", "import_ray"]

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
