"""A running daemon on the Quickstart machine (`warmd start` with no arguments: a real local
Ray cluster, the embedded redis-server, one small FlashInfer module), and what changes to it
do:

- a bad change (`start --config` with TP 7, `start --redis` at a dead port or with a wrong
  password) is validated before it is applied: one line, exit 2, the node stays READY under
  the old configuration;
- the Quickstart node is a builder (no GPU) that also serves, the cluster having no GPU: a
  Triton kernel compiled into its watched cache after READY is counted as runtime JIT.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("triton")

from cluster_support import private_machine, until, warmd  # noqa: E402
from store_support import start_test_server  # noqa: E402

from warmd.store import free_port  # noqa: E402

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    base = tmp_path_factory.mktemp("quickstart")
    with private_machine(base / "home") as env:
        try:
            started = warmd(env, "start")
            assert started.returncode == 0, started.stdout + started.stderr
            yield env, base
        finally:
            warmd(env, "stop", timeout=180)


def _status(env: dict) -> dict:
    status = warmd(env, "status", "--json")
    assert status.returncode == 0, status.stderr
    return json.loads(status.stdout)


def _refused(env: dict, *args: str) -> str:
    """Runs `warmd start ARGS` against the running daemon: refused with one line, exit 2,
    and the node READY under the configuration it had."""
    before = _status(env)
    result = warmd(env, "start", *args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == "" and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr
    after = _status(env)
    assert after["controller"]["config_hash"] == before["controller"]["config_hash"]
    assert after["controller"]["redis"] == before["controller"]["redis"]
    assert [n["state"] for n in after["nodes"]] == ["READY"]
    return result.stderr


def test_a_config_with_a_model_no_node_can_plan_is_refused_and_the_old_one_kept(daemon,
                                                                                 tmp_path):
    env, _base = daemon
    bad = tmp_path / "tp7.yaml"
    bad.write_text(json.dumps({"version": 1, "models": [
        {"name": "tp7", "path": "llama-3.1-8b", "tp": 7, "engine": "sglang",
         "with": ["flashinfer"], "libraries": ["flashinfer"]}]}))
    line = _refused(env, "--config", str(bad))
    assert "models[0] (tp7)" in line and "--tp=7" in line and "kept" in line


def test_a_redis_url_where_nothing_listens_is_refused_and_the_old_store_kept(daemon):
    env, _base = daemon
    line = _refused(env, "--redis", f"redis://127.0.0.1:{free_port()}/0")
    assert "does not answer" in line


def test_a_wrong_redis_password_is_refused_without_showing_it(daemon, tmp_path):
    env, _base = daemon
    server = start_test_server(tmp_path, password="the-right-one")
    try:
        port = server.url.rsplit(":", 1)[1].split("/")[0]
        line = _refused(env, "--redis", f"redis://:hunter2-wrong@127.0.0.1:{port}/0")
        assert "does not answer" in line and "hunter2-wrong" not in line
    finally:
        server.stop()


def test_the_quickstart_node_counts_a_triton_kernel_compiled_after_ready(daemon):
    env, base = daemon
    [node] = _status(env)["nodes"]
    assert node["role"] == "builder" and node["serves"] is True
    assert warmd(env, "status", "--fail-on-runtime-jit").returncode == 0
    # The example model is served by SGLang: `import sglang` defaults TRITON_CACHE_DIR to
    # $SGLANG_CACHE_DIR/triton, the directory the node watches for that plan.
    watched = base / "home" / ".cache" / "sglang" / "triton"
    compiled = subprocess.run([sys.executable, "-m", "tests.triton_support", str(watched)],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert compiled.returncode == 0, compiled.stderr
    until(lambda: _status(env)["nodes"][0]["runtime_jit"], timeout=120)
    [node] = _status(env)["nodes"]
    assert node["runtime_jit"].get("triton") == 1, node["runtime_jit"]
    assert warmd(env, "status", "--fail-on-runtime-jit").returncode == 1


def test_a_store_whose_key_proof_is_another_keys_is_refused(daemon, tmp_path):
    from warmd.store import layout
    from warmd.store.signing import key_proof

    env, _base = daemon
    server = start_test_server(tmp_path)
    try:
        server.client().set(layout.KEY_PROOF_KEY, key_proof(b"the cluster's key"))
        mine = tmp_path / "key"
        mine.write_bytes(b"another key")
        line = _refused({**env, "WARMD_SIGNING_KEY_FILE": str(mine)}, "--redis", server.url)
        assert "key proof FOREIGN" in line
    finally:
        server.stop()
