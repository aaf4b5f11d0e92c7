"""Feeding back what was captured: `warmd plan --learned` lists a plan's learned entries
apart from its tasks, `warmd cache ls --learned` lists every plan's with the planner rule
that missed each (a real redis-server, a real Triton compile captured)."""

from __future__ import annotations

import json

import pytest
from store_support import start_test_server

from tests.cluster_support import private_machine, warmd
from warmd.capture.scope import CaptureScope
from warmd.capture.watch import Capture, CaptureTrust
from warmd.store import open_shared_cache
from warmd.targets import preset

pytest.importorskip("triton")

from tests.triton_support import capture_compile_add  # noqa: E402

PLAN_ARGS = ("--model", "llama-3.1-8b", "--target", "h200", "--with", "flashinfer")


def test_plan_and_cache_ls_list_learned_entries(tmp_path, monkeypatch):
    server = start_test_server(tmp_path)
    try:
        with private_machine(tmp_path / "home") as env:
            planned = warmd(env, "plan", *PLAN_ARGS, "--json")
            assert planned.returncode == 0, planned.stderr
            plan_key = json.loads(planned.stdout)["plan_key"]
            monkeypatch.setenv("WARMD_STATE_DIR", str(tmp_path / "state"))
            root = tmp_path / "triton"
            capture = Capture("gpu-1", [CaptureScope(plan_key, preset("h200").to_json(),
                                                     {"triton": str(root)})],
                              lambda t: open_shared_cache(server.url, target=t), inotify=False,
                              trust=CaptureTrust.OWN_NODES, poll_seconds=3600)
            # a cluster trusting its own nodes: learned entries at once
            event = capture_compile_add(capture, root)

            shown = warmd(env, "plan", *PLAN_ARGS, "--learned", "--redis", server.url,
                          "--json")
            assert shown.returncode == 0, shown.stderr
            data = json.loads(shown.stdout)
            assert [r["entry"] for r in data["learned"]] == [event.entry]
            assert event.entry not in {t["key"] for t in data["tasks"]}
            text = warmd({**env, "COLUMNS": "200"}, "plan", *PLAN_ARGS, "--learned",
                         "--redis", server.url)
            assert text.returncode == 0, text.stderr
            assert "Learned (not planned; installed with the plan) (1)" in text.stdout
            listed = warmd(env, "cache", "ls", "--learned", "--redis", server.url, "--json")
            assert listed.returncode == 0, listed.stderr
            (row,) = json.loads(listed.stdout)
            assert (row["plan"], row["library"], row["entry"]) == (plan_key, "triton",
                                                                   event.entry)
            assert row["missed_by"].startswith("no planner rule: Triton entries")
            other = warmd(env, "cache", "ls", "--learned", "--plan", "0" * 16, "--redis",
                          server.url, "--json")
            assert json.loads(other.stdout) == []
            bad = warmd(env, "cache", "ls", "--plan", plan_key, "--redis", server.url)
            assert bad.returncode == 2 and "--plan goes with --learned" in bad.stderr
    finally:
        server.stop()
