"""A real two-process run: ``torchrun --nproc_per_node 2`` on CPU (gloo), each rank an spdl_rs pipeline over
its elastic share, interrupted mid-epoch and resumed from the merged checkpoint (the example
``examples/torchrun_elastic.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("torch.distributed.run")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "torchrun_elastic.py"


def test_two_ranks_disjoint_complete_equal_batches(tmp_path: Path) -> None:
    n, batch = 1001, 16
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1")
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        str(EXAMPLE), "--out", str(tmp_path), "--samples", str(n), "--batch-size", str(batch),
    ]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert "ok: 2 ranks" in run.stdout + run.stderr
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for epoch in ("epoch0", "epoch1"):
        counts = Counter(i for r in reports for i in r[epoch])
        assert set(counts) == set(range(n)), epoch
        # 1001 over 2 ranks: one sample padded in; epoch 0 (two runs) at most one more.
        assert sum(counts.values()) - n <= (2 if epoch == "epoch0" else 1), epoch
    epoch1 = [set(r["epoch1"]) for r in reports]
    assert len(epoch1[0] & epoch1[1]) <= 1  # disjoint but for the padded sample
    assert reports[0]["epoch1_batches"] == reports[1]["epoch1_batches"] == -(-((n + 1) // 2) // batch)
    assert reports[0]["resumed_batches"] == reports[1]["resumed_batches"]
