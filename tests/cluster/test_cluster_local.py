"""`warmd start` / `stop` / `status` against a real local Ray head that `start` starts, on a
private machine (cluster_support): one daemon per state dir under concurrent starts, `stop`
ending exactly what `start` started, and a config that selects no node. The config has no
`builders:` and this machine no GPU, so nothing is compiled: these tests are about the
daemon's processes, not the warmup."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

pytest.importorskip("ray")

from cluster_support import private_machine, warmd, warmd_popen  # noqa: E402

from warmd.examples import EXAMPLES_DIR  # noqa: E402
from warmd.processes import pid_alive  # noqa: E402

pytestmark = pytest.mark.slow

NO_BUILDERS = """\
version: 1
models:
  - name: llama
    path: {models}/llama-3.1-8b
    target: h200
agent:
  reconcile_seconds: 1
  heartbeat_seconds: 1
  metrics_port: 0
"""
NO_NODE = ("warmd: the config selects no node: none of the 1 node(s) has a GPU and builders "
           "are disabled; set `builders: {enabled: true}` in the config to build kernels on "
           "CPU nodes, or add GPU nodes")


@pytest.fixture
def machine(tmp_path):
    config = tmp_path / "warmd.yaml"
    config.write_text(NO_BUILDERS.format(models=EXAMPLES_DIR))
    with private_machine(tmp_path / "home") as env:
        env["WARMD_CONFIG"] = str(config)
        try:
            yield env
        finally:
            stopped = warmd(env, "stop", timeout=180)
            assert stopped.returncode == 0, stopped.stderr
            head = (services(env).get("ray") or {}).get("pid")
            assert head is None or not pid_alive(head)


def services(env: dict) -> dict:
    path = os.path.join(env["HOME"], ".cache", "warmd", "daemon.json")
    try:
        with open(path) as fh:
            return json.load(fh)
    except FileNotFoundError:
        return {}


def test_two_concurrent_starts_make_one_daemon(machine):
    starts = [warmd_popen(machine, "start", "--json", stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) for _ in range(2)]
    outcomes = [(p.wait(timeout=300), *p.communicate()) for p in starts]
    results = []
    for code, out, err in outcomes:
        # no node to warm here: each start says so in one line and fails
        assert code == 1, out + err
        assert err.strip().splitlines()[-1] == NO_NODE
        results.append(json.loads(out))
    assert sorted(r["controller"] for r in results) == ["created", "updated"]
    assert sorted(r["started_local_ray"] for r in results) == [False, True]  # one Ray head
    [address] = {r["ray_address"] for r in results}
    recorded = services(machine)["ray"]
    assert recorded["address"] == address and pid_alive(recorded["pid"])

    status = warmd(machine, "status")
    assert status.returncode == 1
    assert status.stderr.strip() == NO_NODE
    assert "Controller: running" in status.stdout and f"Ray {address}" in status.stdout
    waited = warmd(machine, "wait-ready", "--timeout", "60")  # a probe never passes on nothing
    assert waited.returncode == 1
    assert waited.stderr.strip() == NO_NODE.replace("warmd: ", "not ready: ", 1)

    stopped = warmd(machine, "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert f"stopped local Ray cluster at {address}" in stopped.stdout
    assert not pid_alive(recorded["pid"])
    assert "ray" not in services(machine)


def test_stop_leaves_the_cache_server_that_start_did_not_start(machine):
    server = warmd(machine, "cache", "server", "start")
    assert server.returncode == 0, server.stderr
    try:
        started = warmd(machine, "start", "--no-wait")
        assert started.returncode == 1 and started.stderr.strip() == NO_NODE
        assert services(machine).get("embedded_redis") is None  # not this daemon's

        stopped = warmd(machine, "stop")
        assert stopped.returncode == 0, stopped.stderr
        assert "stopped local Ray cluster" in stopped.stdout
        assert "embedded Redis" not in stopped.stdout
        still = warmd(machine, "cache", "server", "status")
        assert still.returncode == 0 and "not running" not in still.stdout, still.stdout
    finally:
        warmd(machine, "cache", "server", "stop")


def test_watch_ends_cleanly_on_ctrl_c_and_sigterm(machine, tmp_path):
    started = warmd(machine, "start", "--no-wait")
    assert started.returncode == 1 and started.stderr.strip() == NO_NODE
    for signum, code in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
        shown = tmp_path / f"watch-{signum}.txt"
        with open(shown, "w") as out:
            watch = warmd_popen(machine, "status", "--watch", "--interval", "0.5",
                                stdout=out, stderr=subprocess.PIPE,
                                # as in a background job: the caller ignores SIGINT
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
            deadline = time.monotonic() + 120
            while shown.read_text().count("warmd status") < 2:  # refreshing over Ray
                assert watch.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
            watch.send_signal(signum)
            _, err = watch.communicate(timeout=60)
        assert watch.returncode == code, err
        assert err == ""  # no "Aborted!", no Ray signal dump
