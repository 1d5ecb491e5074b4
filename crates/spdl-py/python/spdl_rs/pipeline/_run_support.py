"""What ``run_pipeline_in_subprocess`` / ``run_pipeline_in_subinterpreter`` send to the worker: the pipeline
wrapper built there, the RNG-state initializers, and picklable stand-ins for stdlib executors."""

from __future__ import annotations

import dataclasses
import random
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from fractions import Fraction
from functools import partial
from typing import Any

from . import defs
from ._builder import build_pipeline

__all__ = ["_Wrapper", "_make_executors_picklable", "_rng_initializers"]


################################################################################
# The pipeline in the worker
################################################################################


def _has_continuous_source(config: Any) -> bool:
    src = config.src
    if isinstance(src, defs.SourceConfig):
        return bool(src.continuous)
    if isinstance(src, defs.MergeConfig):
        return any(_has_continuous_source(c) for c in src.pipeline_configs)
    return False


class _Wrapper:
    """The iterable the worker serves: each iteration builds a pipeline from the config and runs it to its end;
    with a continuous source, one pipeline is built at once and each iteration yields one epoch of it."""

    def __init__(
        self,
        config: Any,
        num_threads: int,
        max_failures: int | Fraction,
        report_stats_interval: float,
        queue_class: Any = None,
        task_hook_factory: Any = None,
        background_tasks: Any = None,
        use_thread_output_queue: bool = False,
    ) -> None:
        self.config = config
        self.build_args: dict[str, Any] = {
            "num_threads": num_threads,
            "max_failures": max_failures,
            "report_stats_interval": report_stats_interval,
            "queue_class": queue_class,
            "task_hook_factory": task_hook_factory,
            "background_tasks": background_tasks,
            "use_thread_output_queue": use_thread_output_queue,
        }
        self._pipeline: Any = None
        if _has_continuous_source(config):
            self._pipeline = self._build()
            self._pipeline.start()

    def _build(self) -> Any:
        return build_pipeline(self.config, **self.build_args)

    def __iter__(self) -> Iterator[Any]:
        if self._pipeline is not None:
            yield from self._pipeline
            return
        pipeline = self._build()
        with pipeline.auto_stop():
            yield from pipeline


################################################################################
# RNG state
################################################################################


def _restore_random(state: Any) -> None:
    random.setstate(state)


def _restore_numpy(state: Any) -> None:
    sys.modules["numpy"].random.set_state(state)


def _restore_torch(state: Any) -> None:
    sys.modules["torch"].set_rng_state(state)


def _rng_initializers() -> list[Callable[[], None]]:
    """Initializers that restore this process's global RNG states in the worker: ``random`` always; NumPy's
    legacy global RNG and PyTorch's CPU generator when already imported (never imported here)."""
    inits: list[Callable[[], None]] = [partial(_restore_random, random.getstate())]
    if (np := sys.modules.get("numpy")) is not None:
        inits.append(partial(_restore_numpy, np.random.get_state()))
    if (torch := sys.modules.get("torch")) is not None:
        inits.append(partial(_restore_torch, torch.get_rng_state()))
    return inits


################################################################################
# Stdlib executors
################################################################################


class _RebuiltExecutor(Executor):
    """A stand-in for a fresh stdlib ``ThreadPoolExecutor`` / ``ProcessPoolExecutor``: it pickles as its
    constructor arguments and makes the real executor on first use, in the process that uses it."""

    def __init__(self, cls: type[Executor], kwargs: dict[str, Any]) -> None:
        self._cls = cls
        self._kwargs = kwargs
        self._executor: Executor | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        return (_RebuiltExecutor, (self._cls, self._kwargs))

    def _get(self) -> Executor:
        if self._executor is None:
            self._executor = self._cls(**self._kwargs)
        return self._executor

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        return self._get().submit(fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=wait, cancel_futures=cancel_futures)


def _stand_in(executor: Any) -> Any:
    cls = type(executor)
    if cls not in (ThreadPoolExecutor, ProcessPoolExecutor):
        return executor
    ex: Any = executor
    if ex._threads if cls is ThreadPoolExecutor else ex._processes:
        what = "threads" if cls is ThreadPoolExecutor else "processes"
        raise ValueError(
            f"A {cls.__name__} given to run_pipeline_in_subprocess must be freshly constructed (no work "
            f"submitted yet): its {what} cannot move to the subprocess."
        )
    kwargs = {"max_workers": ex._max_workers, "initializer": ex._initializer, "initargs": ex._initargs}
    if cls is ThreadPoolExecutor:
        kwargs["thread_name_prefix"] = ex._thread_name_prefix
    return _RebuiltExecutor(cls, kwargs)


def _replace_executors(cfg: Any) -> Any:
    if isinstance(cfg, defs.PipeConfig) and cfg.executor is not None:
        new = _stand_in(cfg.executor)
        return cfg if new is cfg.executor else dataclasses.replace(cfg, executor=new)
    if isinstance(cfg, defs.PathVariantsConfig):
        return dataclasses.replace(cfg, paths=tuple(tuple(_replace_executors(s) for s in p) for p in cfg.paths))
    return cfg


def _make_executors_picklable(config: Any) -> Any:
    """The config with each stdlib Thread/Process pool executor of its stages (merged pipelines included)
    replaced by a stand-in rebuilt in the worker."""
    src = config.src
    if isinstance(src, defs.MergeConfig):
        src = dataclasses.replace(
            src, pipeline_configs=tuple(_make_executors_picklable(c) for c in src.pipeline_configs)
        )
    return dataclasses.replace(config, src=src, pipes=[_replace_executors(p) for p in config.pipes])
