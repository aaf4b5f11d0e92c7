"""Every table and report at 80 columns: no line longer, no identifier cut (task keys,
kernel and node names, IPs, fingerprints), reasons whole. The plan's tables are held in
test_plan_cli, the cache's against a real store in test_store_cli; the screens captured
from a real daemon in docs/screens.md are held here too."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

from warmd.cli.render import ELLIPSIS
from warmd.cluster.state import FAILED, READY, NodeState
from warmd.cluster.state import NodeStatus as st

SCREENS = Path(__file__).resolve().parents[2] / "docs" / "screens.md"
WIDTH = 80


def _whole(value: str, text: str) -> bool:
    """Whether value is in text with every character, in order, wrapping aside (lines broken
    at a space or after a separator, continuation lines indented)."""
    return re.sub(r"\s+", "", value) in re.sub(r"\s+", "", text)


def test_status_at_80_columns_keeps_names_ips_and_reasons_whole():
    from warmd.cli.status_view import render_status
    from warmd.cluster.status import StatusSnapshot

    now = time.time()
    reason = ("model qwen3: model config not found: /models/qwen3-235b-a22b-fp8/"
              "config.json (paths expand on each node)")
    degraded = ("shared cache redis://warmd-writer:***@redis.warmd.svc:6379/0 unreachable: "
                "ConnectionError: Error 111 connecting to redis.warmd.svc:6379. Connection "
                "refused.; kernels were built locally")
    nodes = [NodeState("a" * 56, name="gpu-h200-node-017-3fa9c2d1", ip="10.120.33.217",
                       gpus=8, gpu_type="H200", state=READY, progress_done=12,
                       progress_total=12, kernels={"total": 40, "local_hits": 40},
                       warmed_at=now, warm_seconds=3.1, heartbeat=now).to_json(),
             NodeState("b" * 56, name="gpu-h200-node-018-77c0e1aa", ip="10.120.33.218",
                       gpus=8, gpu_type="H200", state=FAILED, reason=reason,
                       heartbeat=now).to_json(),
             NodeState("c" * 56, name="builder-cpu-01-0b1c2d3e", ip="10.120.40.5",
                       role="builder", state=st.DEGRADED, reason=degraded,
                       heartbeat=now).to_json()]
    snap = StatusSnapshot.from_json({
        "running": True, "source": "ray", "ray_address": "10.120.33.1:6379", "nodes": nodes,
        "controller": {"node_id": "d" * 56, "started_at": now, "config_hash": "b19dc80fbc7f8269",
                       "redis": "redis://warmd-writer:***@redis.warmd.svc:6379/0"},
        "store_size": {"used_memory": 3 << 30, "keys": 5120, "maxmemory": 16 << 30,
                       "maxmemory_policy": "volatile-lru"}})
    text = render_status(snap, WIDTH)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= WIDTH and ELLIPSIS not in text
    for node in snap.nodes:
        [row] = [line for line in lines if line.startswith(f" {node.name} ")]
        assert node.node_id[:8] in row and f" {node.ip} " in row and node.state in row
    assert _whole(reason, text) and _whole(degraded, text)
    assert "Store capacity" in text and "16.0 GiB maxmemory, 18.8% used (volatile-lru)" in text


def test_warmup_summary_at_80_columns_wraps_reasons_whole(monkeypatch):
    from warmd.cli.warmup_view import summary_text
    from warmd.stats import Counters

    monkeypatch.setenv("COLUMNS", str(WIDTH))
    failure = ("FAILED flashinfer/batch_mla/batch_mla_attention_dtype_q_bf16_dtype_kv_bf16/"
               "89bc99a9801c: building batch_mla_attention failed: CalledProcessError: nvcc "
               "fatal: Unsupported gpu architecture 'compute_90a'")
    model = "  qwen3: plan -, 0 tasks, FAILED: model qwen3: model config not found: " \
        "/models/qwen3-235b-a22b-fp8/config.json"
    text = summary_text("warmup of plan 641eaf69d404d0c4: 1/1 tasks in 3.0 s",
                        Counters(tasks=1, tasks_failed=1), [failure, model])
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= WIDTH
    notes = "\n".join(lines[lines.index(next(x for x in lines if x.startswith("FAILED"))):])
    assert _whole(failure, notes) and _whole(model, notes) and ELLIPSIS not in text


def _screens() -> list[str]:
    """The text of every fenced block of docs/screens.md."""
    return re.findall(r"^```text\n(.*?)^```", SCREENS.read_text(), re.M | re.S)


def test_the_documented_screens_are_80_columns_with_nothing_cut():
    screens = _screens()
    commands = " ".join(re.findall(r"^\$ (.*)$", "\n".join(screens), re.M))
    for wanted in ("warmd plan", "warmd status", "warmd cache stats"):
        assert wanted in commands
    for screen in screens:
        assert max(len(line) for line in screen.splitlines()) <= WIDTH
        assert ELLIPSIS not in screen


def _commands(command, path=()):
    """Every command of the click group, as (its path, the command), the group's first."""
    import click

    yield path, command
    if isinstance(command, click.Group):
        for name, sub in sorted(command.commands.items()):
            yield from _commands(sub, (*path, name))


def test_every_help_fits_80_columns_with_no_word_cut(monkeypatch):
    from click.testing import CliRunner

    from warmd.cli import main

    monkeypatch.setenv("COLUMNS", str(WIDTH))
    commands = list(_commands(main))
    assert len(commands) > 15 and ("cache", "server", "status") in dict(commands)
    for path, _command in commands:
        result = CliRunner().invoke(main, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        for line in result.output.splitlines():
            assert len(line) <= WIDTH, (" ".join(path), line)


def test_cache_fingerprint_fits_80_columns_with_every_value_whole(monkeypatch):
    from click.testing import CliRunner

    from warmd.cli import main

    monkeypatch.setenv("COLUMNS", str(WIDTH))
    text = CliRunner().invoke(main, ["cache", "fingerprint", "--target", "h200", "--json"])
    assert text.exit_code == 0, text.output
    inputs = {item["library"]: item["inputs"] for item in json.loads(text.output)}
    result = CliRunner().invoke(main, ["cache", "fingerprint", "--target", "h200"])
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.output.splitlines()) <= WIDTH
    for values in inputs.values():
        for value in values.values():
            shown = json.dumps(value, sort_keys=True) if isinstance(value, dict) else value
            assert _whole(str(shown), result.output)


def _screens_script():
    import importlib.util

    path = SCREENS.parent.parent / "scripts" / "tools" / "screens.py"
    spec = importlib.util.spec_from_file_location("screens_script", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


def test_docs_screens_md_is_what_scripts_screens_py_writes():
    """The plans and --help texts in docs/screens.md are rendered again by the script (real
    `python -m warmd` runs at 80 columns) and must be what is committed: run
    `python scripts/tools/screens.py` after changing what they show. The daemon's screens are
    kept as captured (`--live` renders them)."""
    script = _screens_script()
    committed = SCREENS.read_text()
    written = script.document(live=False, kept=script.kept_blocks(committed))
    assert written == committed, "docs/screens.md is stale: run python scripts/tools/screens.py"
    titles = [s.title for s in script.SCREENS_LIST if not s.live]
    assert {"warmd --help", "warmd plan: DeepSeek-V3"} <= set(titles)
    assert "Summary: 10 tasks (8 deep_gemm, 2 flashinfer)" in committed
