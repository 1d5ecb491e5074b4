"""The cost of whole-pipeline checkpoints in spdl_rs at 10^6 items: the size of ``Pipeline.state_dict()`` and
the time of one call mid-epoch, and the per-item cost of a checkpointable pipeline (items keyed, ops wrapped)
against the same pipeline over a plain iterable, side by side in one run.

    python benches/compare/checkpoint_overhead.py [--n 1000000]
"""

from __future__ import annotations

import argparse
import pickle
import time

from spdl_rs.pipeline import PipelineBuilder


class Stateful:
    """``range(n)`` with the Stateful protocol (seed and epoch)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.epoch = 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch}

    def load_state_dict(self, state: dict) -> None:
        self.epoch = state["epoch"]

    def __iter__(self):
        self.epoch += 1
        return iter(range(self.n))


class Plain:
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


def work(x: int) -> int:
    return x * 3


def run(source, n: int, every: int) -> tuple[float, list[float], int]:
    p = PipelineBuilder().add_source(source).pipe(work, concurrency=2).add_sink(8).build(num_threads=2)
    calls: list[float] = []
    size = 0
    t = time.perf_counter()
    with p.auto_stop():
        for i, _ in enumerate(p):
            if every and i % every == every - 1:
                s = time.perf_counter()
                state = p.state_dict()
                calls.append(time.perf_counter() - s)
                size = max(size, len(pickle.dumps(state)))
    return time.perf_counter() - t, calls, size


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--every", type=int, default=1000)
    args = parser.parse_args()
    n = args.n
    plain_s, _, _ = run(Plain(n), n, 0)
    keyed_s, _, _ = run(Stateful(n), n, 0)
    with_calls_s, calls, size = run(Stateful(n), n, args.every)
    print(f"items: {n}")
    print(f"plain source:             {plain_s:.2f} s ({plain_s * 1e6 / n:.2f} us/item)")
    print(f"checkpointable (keyed):   {keyed_s:.2f} s ({keyed_s * 1e6 / n:.2f} us/item, {keyed_s / plain_s:.2f}x plain)")
    print(f"  + state_dict() every {args.every}: {with_calls_s:.2f} s; {len(calls)} calls, "
          f"mean {sum(calls) / len(calls) * 1e6:.0f} us, max {max(calls) * 1e6:.0f} us; largest pickled state {size} bytes")


if __name__ == "__main__":
    main()
