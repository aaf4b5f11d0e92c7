"""Fast checks of `warmd warmup` and run_warmup's parts that need no compile: counters,
bad input, GPU assignment, task records, FlashInfer's arch names. (The real builds are in
test_warmup_cpu.py and test_flashinfer_cache.py, behind their module-scoped build fixtures.)"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from flashinfer_support import FLASHINFER_PLAN_ARGS, flashinfer_plan

from warmd.errors import WarmdInputError
from warmd.libraries.flashinfer.cache import arch_dir
from warmd.stats import Counters
from warmd.warmup import WarmupOptions


def _cli(args: list[str], env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from warmd.cli import main; main()", *args],
                          capture_output=True, text=True, env=env, timeout=timeout)


def test_counters_add_json_and_text():
    c = Counters(local_hits=3, compiled=1, compile_seconds=2.5)
    c.add(Counters(remote_hits=2, failed=1, bytes_fetched=2048)).add({"compiled": 1,
                                                                      "unknown": 7})
    assert (c.kernels, c.compiled, c.remote_hits, c.bytes_fetched) == (8, 2, 2, 2048)
    assert c.hit_rate == pytest.approx(5 / 8)
    data = c.to_json()
    assert Counters.from_json(data) == c and "unknown" not in data
    text = c.render_text("stats")
    assert text.splitlines()[0] == "stats"
    assert "62.5 %" in text and "2.0 KiB" in text and "( 37.5%)" in text
    assert Counters().hit_rate == 0.0


def test_bad_task_filter_is_input_error():
    with pytest.raises(WarmdInputError, match="task-filter"):
        WarmupOptions(task_filter="(").select(flashinfer_plan().tasks)


def test_cli_bad_input_is_one_line_exit_2(tmp_path):
    env = {**os.environ, "WARMD_STATE_DIR": str(tmp_path / "state"), "WARMD_REDIS_URL": "off"}
    proc = _cli(["warmup", *FLASHINFER_PLAN_ARGS, "--task-filter", "(", "--no-shared"], env)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("warmd: error: invalid --task-filter")
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_one_worker_per_gpu_with_distinct_visible_devices(monkeypatch):
    """On a node with several GPUs each worker process sees exactly one, its own (the GPUs
    here are a FAKE: this machine has none; only the assignment is checked)."""
    from warmd.targets import Target
    from warmd.warmup import sizing
    from warmd.warmup.workers import gpu_env

    fake = Target("NVIDIA H200", (9, 0), 132, count=4, source="fake")
    monkeypatch.setattr(sizing, "_local_gpus", lambda _visible: (fake,))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    ids = sizing.gpu_ids(WarmupOptions())
    assert ids == ["0", "1", "2", "3"]
    envs = [gpu_env({"X": "1"}, ids, i) for i in range(4)]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ids
    assert all(e["X"] == "1" for e in envs)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert sizing.gpu_ids(WarmupOptions()) == ["2", "3"]
    assert sizing.gpu_ids(WarmupOptions(gpu_ids=("1",))) == ["1"]


def test_damaged_or_unwritable_task_records_never_fail_a_task(tmp_path):
    """A record only improves later counts: a damaged one reads as none, and a disk that
    refuses the write is logged, not turned into a failed task."""
    from warmd.cache.records import LocalTaskRecord, read_record, record_path, write_record

    root = tmp_path / "cache"
    assert write_record(root, LocalTaskRecord("task-a", {"kernel.x": 1.5}))
    assert read_record(root, "task-a").entries == {"kernel.x": 1.5}
    record_path(root, "task-a").write_text('{"entries": {"kernel.x": null}}')
    assert read_record(root, "task-a").entries == {}
    record_path(root, "task-a").write_text("[1, 2")
    assert read_record(root, "task-a").entries == {}
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    assert write_record(blocked, LocalTaskRecord("task-b", {"kernel.y": 2.0})) is False
    assert not list(tmp_path.glob("**/.*.json.*"))  # no temporary file left behind


def test_arch_dir_names():
    assert arch_dir("9.0a") == "90a"
    assert arch_dir("90a") == "90a"
    assert arch_dir("10.0a 9.0a") == "90a_100a"
