from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import cirron as ci

pytest.importorskip("torch")
SCRIPT = Path(__file__).parent / "torch_ddp" / "train_ddp.py"


@pytest.mark.slow
def test_ddp_with_gloo_on_two_processes_traces_every_rank(tmp_path):
    torchrun = Path(sys.executable).with_name("torchrun")
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("CIRRON_", "OTEL_"))}
    environment["OMP_NUM_THREADS"] = "1"
    result = subprocess.run(
        [str(torchrun), "--standalone", "--nproc_per_node=2", str(SCRIPT), str(tmp_path / "out")],
        env=environment,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    spans = ci.spool_spans(str(tmp_path / "out"))
    by_rank: dict[int, Counter[str]] = {}
    for span in spans:
        resource = {a["key"]: a["value"] for a in span["resource"]}
        rank = int(resource["cirron.rank"]["intValue"])
        assert resource["cirron.world_size"] == {"intValue": "2"}
        by_rank.setdefault(rank, Counter())[span["name"]] += 1
    assert sorted(by_rank) == [0, 1]
    for counts in by_rank.values():
        # 32 samples / 2 ranks / batch 4 = 4 steps per epoch, 2 epochs
        assert counts["epoch"] == 2
        assert counts["step"] == 8
        assert counts["forward"] == 8
        assert counts["backward"] == 8
        assert counts["optimizer_step"] == 8
        assert counts["cirron.session"] == 1
    forwards = [s for s in spans if s["name"] == "forward"]
    modules = {
        a["value"]["stringValue"] for s in forwards for a in s["attributes"] if a["key"] == "module"
    }
    assert modules == {"Sequential"}  # the model, not its DDP wrapper
