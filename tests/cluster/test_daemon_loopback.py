"""`warmd start` with no arguments (the Quickstart) exposes nothing beyond this machine: every
socket that the local Ray head, the controller, the agents (their metrics endpoints) and
the embedded Redis listen on is on loopback (read from /proc). And how the head is started
for a config that names another address: with Ray's token authentication."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("ray")

from cluster_support import private_machine, warmd  # noqa: E402
from listening import is_loopback, listening, processes_with_env  # noqa: E402

from warmd.cluster.local_head import head_launch  # noqa: E402

pytestmark = pytest.mark.slow


def test_start_with_no_arguments_listens_on_loopback_only(tmp_path):
    with private_machine(tmp_path / "home") as env:
        try:
            started = warmd(env, "start", "--json")
            assert started.returncode == 0, started.stdout + started.stderr
            ours = processes_with_env(f"RAY_TMPDIR={env['RAY_TMPDIR']}")
            servers = list((tmp_path / "home").rglob("server.json"))  # the embedded Redis
            ours |= {json.loads(path.read_text())["pid"] for path in servers}
            sockets = listening(ours)
            commands = {s.command for s in sockets}
            assert {"gcs_server", "raylet"} <= commands, sockets  # the head, found
            assert any(s.command.startswith("redis") for s in sockets), sockets
            exposed = [s for s in sockets if not is_loopback(s.address)]
            assert not exposed, exposed
            status = warmd(env, "status", "--json")
            [node] = json.loads(status.stdout)["nodes"]
            assert node["metrics_url"].startswith("http://127.0.0.1:")
            assert "without authentication" not in status.stderr, status.stderr
            # Another state dir finds this head through Ray's recorded address and joins
            # it on loopback (joined otherwise, Ray's driver waited without end).
            other = {**env, "HOME": str(tmp_path / "other")}
            seen = warmd(other, "status", "--json", timeout=120)
            assert seen.returncode in (0, 1), seen.stderr
            assert [n["metrics_url"] for n in json.loads(seen.stdout)["nodes"]] == [
                node["metrics_url"]]
        finally:
            warmd(env, "stop")


def test_a_head_for_other_machines_turns_on_ray_token_authentication(tmp_path, monkeypatch):
    monkeypatch.setenv("WARMD_STATE_DIR", str(tmp_path / "state"))
    environ = dict(os.environ)
    launch = head_launch("10.1.2.3", [1, 2, 3], environ)
    assert "--node-ip-address=10.1.2.3" in launch.cmd
    assert launch.env["RAY_AUTH_MODE"] == "token" and not launch.warnings
    token = tmp_path / "state" / "ray-auth-token"
    assert launch.env["RAY_AUTH_TOKEN_PATH"] == str(token)
    assert token.stat().st_mode & 0o777 == 0o600 and len(token.read_text()) == 64
    # asked to run without it: it does, and says what that means
    off = head_launch("10.1.2.3", [1, 2, 3], environ, auth_mode="disabled")
    assert off.env.get("RAY_AUTH_MODE") != "token" and off.auth_token_path is None
    assert "without authentication" in off.warnings[0]
    local = head_launch("127.0.0.1", [1, 2, 3], environ)
    assert "--node-ip-address=127.0.0.1" in local.cmd and local.auth_token_path is None


def test_status_warns_of_each_endpoint_open_off_loopback_without_authentication(monkeypatch):
    from warmd.cluster.exposure import exposure_warnings
    from warmd.cluster.state import NodeState
    from warmd.cluster.status import StatusSnapshot

    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    open_snap = StatusSnapshot(running=True, source="ray", ray_address="10.1.2.3:6379", nodes=(
        NodeState("n1", name="gpu-a", metrics_url="http://10.1.2.4:9464/metrics"),
        NodeState("n2", name="gpu-b", metrics_url="http://127.0.0.1:9464/metrics")))
    warnings = exposure_warnings(open_snap, "redis://10.1.2.5:6379/0")
    assert len(warnings) == 3, warnings
    assert "10.1.2.3:6379" in warnings[0] and "RAY_AUTH_MODE" in warnings[0]
    assert "gpu-a" in warnings[1] and "gpu-b" not in " ".join(warnings)
    assert "without a password" in warnings[2]
    monkeypatch.setenv("RAY_AUTH_MODE", "token")  # Ray's token auth; a Redis password
    assert exposure_warnings(open_snap, "redis://:pw@10.1.2.5:6379/0") == warnings[1:2]
    local = StatusSnapshot(running=True, source="ray", ray_address="127.0.0.1:6379", nodes=(
        NodeState("n2", metrics_url="http://127.0.0.1:9464/metrics"),))
    assert exposure_warnings(local, "redis://127.0.0.1:6379/0") == []


_CLIENT = """
import logging, os, sys
import ray
from ray._private import ray_constants
ray_constants.ENABLE_RAY_CLUSTER = False  # the head is on loopback: so is this client
if len(sys.argv) > 2:  # the token, as a client that holds it passes it
    from ray._private.authentication.authentication_token_setup import _enable_token_auth
    os.environ["RAY_AUTH_TOKEN_PATH"] = sys.argv[2]
    _enable_token_auth()
ray.init(address=sys.argv[1], logging_level=logging.ERROR)
print("connected", len(ray.nodes()))
"""


def test_with_ray_token_authentication_only_a_client_with_the_token_gets_in(tmp_path):
    """RAY_AUTH_MODE=token asked for a local head: warmd starts it with a token of its own,
    its own commands use it, and a process without it cannot run anything there."""
    import subprocess
    import sys

    with private_machine(tmp_path / "home") as env:
        env = {**env, "RAY_AUTH_MODE": "token"}
        try:
            started = warmd(env, "start", "--no-wait", "--json")
            assert started.returncode == 0, started.stdout + started.stderr
            address = json.loads(started.stdout)["ray_address"]
            token = tmp_path / "home" / ".cache" / "warmd" / "ray-auth-token"
            assert token.stat().st_mode & 0o777 == 0o600
            status = warmd(env, "status", "--json")  # a new process: the recorded token
            assert json.loads(status.stdout)["running"], status.stderr
            intruder = {**env, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
            refused = subprocess.run([sys.executable, "-c", _CLIENT, address],
                                     env={**intruder, "RAY_AUTH_MODE": "disabled"},
                                     capture_output=True, text=True, timeout=120)
            assert refused.returncode != 0 and "connected" not in refused.stdout
            holder = subprocess.run([sys.executable, "-c", _CLIENT, address, str(token)],
                                    env=intruder, capture_output=True, text=True,
                                    timeout=120)
            assert holder.stdout.startswith("connected"), holder.stderr[-2000:]
        finally:
            warmd(env, "stop")

