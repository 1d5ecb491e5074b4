"""``profile_pipeline``: each stage run alone at several concurrencies, measured as the auto-tuner measures.

Every figure comes from the engine's ``autotune::Window`` over the stage's run (``Pipeline.stats_window``), the
measurement the live auto-tuner decides on, so an offline sweep and the controller agree on what a rate is.

Also the self-diagnostic mode of :py:func:`build_pipeline` (``SPDL_PIPELINE_DIAGNOSTIC_MODE``) and the default
profile hook and callback settings.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from .. import _native
from . import _region, defs
from ._core import _build
from ._hooks import _get_env_bool
from ._pipeline import Pipeline

__all__ = [
    "ProfileHook",
    "ProfileResult",
    "diagnostic_mode_num_sources",
    "get_default_profile_callback",
    "get_default_profile_hook",
    "is_diagnostic_mode_enabled",
    "profile_pipeline",
    "set_default_profile_callback",
    "set_default_profile_hook",
]

_LG = logging.getLogger("spdl_rs.pipeline")

U = TypeVar("U")

#: The concurrencies a pipe stage is measured at (aggregates and disaggregates: 1 only), as SPDL's.
_CONCURRENCIES = (32, 16, 8, 4, 1)


class ProfileHook(ABC):
    """Code to run around the profiling of each stage and of the whole pipeline (e.g. a profiler trace)."""

    @abstractmethod
    @contextmanager
    def stage_profile_hook(self, stage: str, concurrency: int) -> Iterator[None]:
        """Runs around the measurement of ``stage`` at ``concurrency``."""
        ...

    @abstractmethod
    @contextmanager
    def pipeline_profile_hook(self) -> Iterator[None]:
        """Runs around the whole :py:func:`profile_pipeline` call."""
        ...


class _NoOpHook(ProfileHook):
    @contextmanager
    def stage_profile_hook(self, stage: str, concurrency: int) -> Iterator[None]:  # noqa: ARG002
        yield

    @contextmanager
    def pipeline_profile_hook(self) -> Iterator[None]:
        yield


#: One measurement: the stage at one concurrency (``concurrency``, ``qps`` and ``occupancy_rate`` as SPDL's,
#: and the rest of the engine's window over the stage's run).
_ProfileStats = _native.pipeline._ProfileStats


@dataclass
class ProfileResult:
    """ProfileResult()

    What :py:func:`profile_pipeline` measured for one stage."""

    name: str
    """The stage's name."""

    stats: Sequence[_ProfileStats]
    """One entry per concurrency tried, with ``concurrency``, ``qps`` (items the stage put out per second)
    and ``occupancy_rate`` (share of the time its output queue held an item, 0.0 to 1.0), and (spdl_rs
    only) the stage's ``busy``, ``starved`` and ``blocked`` shares, ``task_mean``, the input
    ``throughput``, ``num_items`` and the window's ``duration``: all from one ``autotune::Window``."""


def _no_op(_: ProfileResult) -> None:
    pass


_DEFAULT_HOOK = _NoOpHook()
_DEFAULT_PROFILE_HOOK: ProfileHook | None = None
_DEFAULT_PROFILE_CALLBACK: Callable[[ProfileResult], None] | None = None


def _build_plain(cfg: Any, num_threads: int) -> Pipeline[Any]:
    """``cfg`` built natively: no hooks, custom queues or background tasks, whatever the defaults say."""
    return _build(
        cfg.src,
        cfg.pipes,
        buffer_size=cfg.sink.buffer_size,
        num_threads=num_threads,
        max_failures=-1,
        report_stats_interval=-1,
        stage_buffer_size=2,
        extensions=False,
        region_step=_region.region_step,
    )


def _run(pipeline: Pipeline[U], concurrency: int) -> tuple[list[U], _ProfileStats]:
    """Runs ``pipeline`` (source, the profiled stage, sink) to its end: its outputs, and the stage measured
    by the window from the pipeline's start to the end of its output (taken before the stop, whose joining
    is no part of the stage's run)."""
    outputs: list[U] = []
    with pipeline.auto_stop():
        for item in pipeline:
            outputs.append(item)
        window = pipeline.stats_window()
    return outputs, _ProfileStats.from_window(window, concurrency, len(outputs))


def _fetch_inputs(src: Any, num_items: int) -> list[Any]:

    pipeline = _build_plain(defs.PipelineConfig(src=src, pipes=[], sink=defs.SinkConfig(1)), 1)
    items: list[Any] = []
    with pipeline.auto_stop():
        for item in pipeline:
            items.append(item)
            if len(items) >= num_items:
                break
    _LG.info("Fetched %d input samples.", len(items))
    if not items:
        raise RuntimeError("No input samples are fetched.")
    return items


def _profile_pipe(
    inputs: list[Any], pipe: Any, hook: ProfileHook, callback: Callable[[ProfileResult], None]
) -> tuple[list[Any], ProfileResult]:

    if not inputs:
        raise RuntimeError(f"An empty input was provided to stage {pipe.name}")
    is_pipe = isinstance(pipe, defs.PipeConfig)
    stats: list[_ProfileStats] = []
    outputs: list[Any] = []
    for concurrency in _CONCURRENCIES if is_pipe else (1,):
        stage = dataclasses.replace(pipe, concurrency=concurrency, executor=None) if is_pipe else pipe
        cfg: Any = defs.PipelineConfig(src=defs.SourceConfig(inputs), pipes=[stage], sink=defs.SinkConfig(2))
        pipeline = _build_plain(cfg, concurrency)
        with hook.stage_profile_hook(pipe.name, concurrency):
            outputs, measured = _run(pipeline, concurrency)
        _LG.info(" - Concurrency: %d", concurrency)
        _LG.info(" - QPS: %.2f", measured.qps)
        _LG.info(" - Occupancy Rate: %.2f", measured.occupancy_rate)
        stats.append(measured)
    result = ProfileResult(pipe.name, stats)
    callback(result)
    return outputs, result


def _profile_pipeline(
    cfg: Any, num_inputs: int, hook: ProfileHook, callback: Callable[[ProfileResult], None]
) -> tuple[list[Any], list[ProfileResult]]:

    _LG.info("Fetching %d inputs.", num_inputs)
    results: list[ProfileResult] = []
    if isinstance(cfg.src, defs.SourceConfig):
        inputs = _fetch_inputs(cfg.src, num_inputs)
    elif isinstance(cfg.src, defs.MergeConfig):
        inputs = []
        for sub in cfg.src.pipeline_configs:
            sub_outputs, sub_results = _profile_pipeline(sub, num_inputs, hook, callback)
            inputs.extend(sub_outputs)
            results.extend(sub_results)
        random.shuffle(inputs)
    else:
        raise ValueError(f"Unexpected source type {type(cfg.src)}")
    for pipe in cfg.pipes:
        if not isinstance(pipe, (defs.PipeConfig, defs.AggregateConfig, defs.DisaggregateConfig)):
            _LG.warning("Skipping %s stage in profiling (not supported).", type(pipe).__name__)
            continue
        _LG.info("Profiling Stage: %s", pipe.name)
        inputs, result = _profile_pipe(inputs, pipe, hook, callback)
        results.append(result)
    return inputs, results


def profile_pipeline(
    cfg: Any,
    num_inputs: int = 1000,
    *,
    callback: Callable[[ProfileResult], None] | None = None,
    hook: ProfileHook | None = None,
) -> Sequence[ProfileResult]:
    """**[Experimental]** Measures each stage of ``cfg`` on its own at concurrencies 32, 16, 8, 4 and 1 (an
    aggregate or disaggregate at 1), and logs and returns the throughput and output-queue occupancy of each.

    The source's first ``num_inputs`` items are fetched once; each stage is then run (natively, with
    ``num_threads`` equal to the concurrency) on the previous stage's outputs, and measured by the window from
    its pipeline's start to the end of its output (:py:meth:`Pipeline.stats_window`: the measurement the live
    auto-tuner of ``build(autotune=True)`` decides on). ``qps`` is the stage's output rate in that window.
    ``PathVariants`` and ``.to()`` markers are skipped with a warning; a ``Merge`` source profiles each merged
    pipeline and shuffles their outputs together. Only local rank 0 (``LOCAL_RANK``) profiles; other ranks
    return ``[]``.

    Args:
        cfg: The pipeline (a ``PipelineConfig``).
        num_inputs: How many source items to profile with.
        callback: Called with each stage's :py:class:`ProfileResult` once it is measured (default:
            :py:func:`spdl_rs.pipeline.config.set_default_profile_callback`'s, else nothing).
        hook: A :py:class:`ProfileHook` run around the whole profiling and each measurement (default:
            :py:func:`spdl_rs.pipeline.config.set_default_profile_hook`'s, else none).

    Returns:
        One :py:class:`ProfileResult` per profiled stage, in pipeline order.
    """
    hook_ = hook or _DEFAULT_PROFILE_HOOK or _DEFAULT_HOOK
    callback_ = callback or _DEFAULT_PROFILE_CALLBACK or _no_op
    with hook_.pipeline_profile_hook():
        if int(os.environ.get("LOCAL_RANK", "0")) != 0:
            _LG.info(
                "Distributed training is enabled. Profiling is only performed on local rank 0. "
                "Exiting without profiling."
            )
            return []
        _, results = _profile_pipeline(cfg, num_inputs, hook_, callback_)
        return results


################################################################################
# Self-diagnostic mode
################################################################################


def is_diagnostic_mode_enabled() -> bool:
    """Whether ``SPDL_PIPELINE_DIAGNOSTIC_MODE`` is set to a true value: then :py:func:`build_pipeline` returns
    a pipeline that profiles each stage (:py:func:`profile_pipeline`) and exits the program."""
    return _get_env_bool("SPDL_PIPELINE_DIAGNOSTIC_MODE")


def diagnostic_mode_num_sources() -> int:
    """How many source items diagnostic mode profiles with: ``SPDL_PIPELINE_DIAGNOSTIC_MODE_NUM_ITEMS``, or
    1000."""
    return int(os.environ.get("SPDL_PIPELINE_DIAGNOSTIC_MODE_NUM_ITEMS", 1000))


class _ProfilePipeline(Pipeline[U]):
    """The pipeline of diagnostic mode: its first ``get_item`` profiles the config and exits the program."""

    def __init__(self, pipeline_cfg: Any, num_items: int) -> None:  # noqa: D107 (no engine behind it)
        self._pipeline_cfg = pipeline_cfg
        self._num_items = num_items
        self._started = True
        self._stopped = False

    def __repr__(self) -> str:
        return f"<spdl_rs.pipeline.Pipeline (diagnostic mode) {self._pipeline_cfg!r}>"

    def __str__(self) -> str:
        return str(self._pipeline_cfg)

    def start(self, *, timeout: float | None = None, **kwargs: Any) -> None:
        pass

    def stop(self, *, timeout: float | None = None, **kwargs: Any) -> None:
        pass

    def get_item(self, *, timeout: float | None = None) -> U:  # noqa: ARG002
        profile_pipeline(self._pipeline_cfg, self._num_items)
        _LG.info("Profiling completed. Exiting.")
        raise SystemExit(0)


def _build_pipeline_diagnostic_mode(cfg: Any) -> Pipeline[Any]:
    return _ProfilePipeline(cfg, diagnostic_mode_num_sources())


def set_default_profile_hook(hook: ProfileHook | None = None) -> None:
    """Sets the :py:class:`ProfileHook` :py:func:`profile_pipeline` uses when given none (``None``: no hook)."""
    global _DEFAULT_PROFILE_HOOK
    _DEFAULT_PROFILE_HOOK = hook


def get_default_profile_hook() -> ProfileHook | None:
    """The default profile hook (``None`` when unset)."""
    return _DEFAULT_PROFILE_HOOK


def set_default_profile_callback(callback: Callable[[ProfileResult], None] | None = None) -> None:
    """Sets the function :py:func:`profile_pipeline` calls with each stage's result when given none
    (``None``: no callback)."""
    global _DEFAULT_PROFILE_CALLBACK
    _DEFAULT_PROFILE_CALLBACK = callback


def get_default_profile_callback() -> Callable[[ProfileResult], None] | None:
    """The default profile callback (``None`` when unset)."""
    return _DEFAULT_PROFILE_CALLBACK
