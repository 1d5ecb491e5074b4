"""Moving large NumPy arrays from a worker process: plain pickling through the queue vs the shared-memory arenas,
spdl_rs and (if importable) SPDL 0.8.0 side by side in one run.

Usage (SPDL and spdl_rs in one interpreter: the peers' venv, with spdl_rs's package on the path):

    PYTHONPATH=crates/spdl-py/python .venv-peers/bin/python benches/compare/arena_transfer.py [--items 40] [--mib 8]

Each case starts one worker (fork), iterates once to warm up, then times ``--rounds`` iterations of ``--items``
items, each ``{"i": i, "array": <float32 array of --mib MiB>}``; the parent touches one element per array.
Prints items/s per case and each case's ratio to the plain pickling of the same library.
"""

import argparse
import statistics
import time
from functools import partial

import numpy as np


class Arrays:
    def __init__(self, n: int, mib: int) -> None:
        self.n = n
        self.base = np.ones(mib * (1 << 20) // 4, dtype=np.float32)

    def __iter__(self):
        for i in range(self.n):
            yield {"i": i, "array": self.base + 0}  # a fresh array per item, as a loader makes


def make(n: int, mib: int) -> Arrays:
    return Arrays(n, mib)


def run_case(lib, arena_kind: str, items: int, mib: int, rounds: int) -> float:
    arena = None
    unit = mib * (1 << 20) + 4096
    if arena_kind == "ring":
        arena = lib.SharedMemoryRingBuffer(6 * unit)
    elif arena_kind == "pool":
        arena = lib.SharedMemorySegmentPool(unit + 4096, 6)
    src = lib.iterate_in_subprocess(partial(make, items, mib), buffer_size=3, arena=arena, timeout=60)
    for x in src:  # warm-up
        del x
    rates = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for x in src:
            float(x["array"][-1])
            del x
        rates.append(items / (time.perf_counter() - t0))
    del src
    return statistics.median(rates)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=40)
    ap.add_argument("--mib", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    import spdl_rs.pipeline as rs

    libs = [("spdl_rs", rs)]
    try:
        import spdl.pipeline as spdl

        libs.append(("spdl", spdl))
    except ImportError:
        pass
    print(f"{args.items} items of {args.mib} MiB, buffer_size=3, median of {args.rounds} rounds")
    print(f"{'library':<8} {'transport':<10} {'items/s':>9} {'vs pickle':>10}")
    for name, lib in libs:
        base = None
        for kind in ("pickle", "ring", "pool"):
            rate = run_case(lib, kind, args.items, args.mib, args.rounds)
            base = base or rate
            print(f"{name:<8} {kind:<10} {rate:9.1f} {rate / base:9.2f}x")


if __name__ == "__main__":
    main()
