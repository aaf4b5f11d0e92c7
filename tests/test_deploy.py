"""deploy/: every manifest parses, has what its system requires, and every warmd command in
it exists in the CLI with those flags; the Redis ACL users load into a real redis-server and
get exactly the rights they are documented to have."""

from __future__ import annotations

import configparser
import contextlib
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import redis
import yaml
from redis.backoff import NoBackoff
from redis.retry import Retry

from warmd.cli import main
from warmd.cluster.state import NodeState, node_records
from warmd.config import parse_config
from warmd.store import free_port

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
SETTINGS = (ROOT / "warmd" / "settings.py").read_text()
_SEPARATORS = {";", "&&", "||", "|", "&", "then", "do", "else", "fi", "done", "(", ")"}


def warmd_commands(text: str) -> list[list[str]]:
    """Every `warmd ...` invocation in a shell snippet, as tokens up to the next operator."""
    found = []
    for line in text.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()")
        lexer.whitespace_split = True
        tokens = list(lexer)
        for i, token in enumerate(tokens):
            if Path(token).name == "warmd":
                cmd = []
                for t in tokens[i:]:
                    if t in _SEPARATORS:
                        break
                    cmd.append(t)
                found.append(cmd)
    return found


def check_cli(tokens: list[str]) -> None:
    """The subcommand exists and each --flag is one of its options (per click's tree)."""
    assert len(tokens) >= 2, tokens
    command = main.commands.get(tokens[1])
    assert command is not None, f"no `warmd {tokens[1]}` subcommand"
    options = {o for p in command.params for o in [*p.opts, *p.secondary_opts]}
    for token in tokens[2:]:
        if token.startswith("-"):
            assert token.split("=", 1)[0] in options, f"`warmd {tokens[1]}` has no {token}"


def warmd_env_names(text: str) -> set[str]:
    return set(re.findall(r"\bWARMD_[A-Z_]+\b", text))


# --- KubeRay ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def kuberay():
    docs = list(yaml.safe_load_all((DEPLOY / "kuberay" / "raycluster.yaml").read_text()))
    return {d["kind"]: d for d in docs}


def containers(cluster: dict) -> dict[str, dict]:
    spec = cluster["spec"]
    out = {"head": spec["headGroupSpec"]["template"]["spec"]}
    for group in spec["workerGroupSpecs"]:
        out[group["groupName"]] = group["template"]["spec"]
    return out


def test_kuberay_manifest_shape(kuberay):
    assert set(kuberay) == {"ConfigMap", "RayCluster"}
    cluster = kuberay["RayCluster"]
    assert cluster["apiVersion"] == "ray.io/v1"
    assert cluster["metadata"]["annotations"]["ray.io/overwrite-container-cmd"] == "true"
    assert cluster["spec"]["headGroupSpec"]["rayStartParams"]["num-gpus"] == "0"
    groups = cluster["spec"]["workerGroupSpecs"]
    assert groups and all(g["minReplicas"] <= g["replicas"] <= g["maxReplicas"] for g in groups)
    for name, pod in containers(cluster).items():
        [container] = pod["containers"]
        assert container["image"] and container["command"] == ["/bin/bash", "-lc", "--"]
        script = container["args"][0]
        assert "$KUBERAY_GEN_RAY_START_CMD" in script, name
        volumes = {v["name"]: v for v in pod["volumes"]}
        for mount in container["volumeMounts"]:
            assert mount["name"] in volumes, f"{name}: mount of undeclared {mount['name']}"
        config_maps = {v["configMap"]["name"] for v in volumes.values() if "configMap" in v}
        assert config_maps <= {kuberay["ConfigMap"]["metadata"]["name"]}
        for env in container["env"]:
            if env["name"].startswith("WARMD_"):
                assert f'"{env["name"]}"' in SETTINGS, f"{env['name']} is no warmd setting"


def test_kuberay_config_is_a_valid_warmd_yaml(kuberay):
    config = parse_config(yaml.safe_load(kuberay["ConfigMap"]["data"]["warmd.yaml"]))
    cluster = kuberay["RayCluster"]
    worker = cluster["spec"]["workerGroupSpecs"][0]["template"]
    port = str(config.agent.metrics_port)
    assert worker["metadata"]["annotations"]["prometheus.io/port"] == port
    [container] = worker["spec"]["containers"]
    assert {p["containerPort"] for p in container["ports"]} == {config.agent.metrics_port}
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    for model in config.models:
        assert any(model.path.startswith(m + "/") for m in mounts), model.path
    assert any(config.signing_key_file.startswith(m + "/") for m in mounts)
    assert container["resources"]["limits"]["nvidia.com/gpu"] >= 1


def test_kuberay_head_starts_the_controller_and_workers_prejoin(kuberay):
    pods = containers(kuberay["RayCluster"])
    head = pods.pop("head")["containers"][0]
    head_cmds = warmd_commands(head["args"][0])
    assert [c[1] for c in head_cmds] == ["start"]
    assert "--no-wait" in head_cmds[0]
    config_path = next(e["value"] for e in head["env"] if e["name"] == "WARMD_CONFIG")
    mounts = {m["mountPath"] for m in head["volumeMounts"]}
    assert str(Path(config_path).parent) in mounts
    for pod in pods.values():
        [worker] = pod["containers"]
        script = worker["args"][0]
        cmds = warmd_commands(script)
        assert cmds[0][:3] == ["warmd", "warmup", "--from-config"]
        assert str(Path(cmds[0][3]).parent) in {m["mountPath"] for m in worker["volumeMounts"]}
        lines = script.splitlines()
        prejoin = next(i for i, line in enumerate(lines) if "--from-config" in line)
        join = next(i for i, line in enumerate(lines) if "$KUBERAY_GEN_RAY_START_CMD" in line)
        assert prejoin < join  # warm before joining
        probe = worker["readinessProbe"]["exec"]["command"]
        cmds += warmd_commands(probe[-1])
        assert any(c[1] == "wait-ready" for c in cmds)
        for cmd in cmds:
            check_cli(cmd)
    for cmd in head_cmds:
        check_cli(cmd)


def test_kuberay_worker_join_label_parses_as_ray_parses_it(kuberay):
    label_utils = pytest.importorskip("ray._private.label_utils")
    pods = containers(kuberay["RayCluster"])
    pods.pop("head")
    for pod in pods.values():
        [worker] = pod["containers"]
        join = next(line for line in worker["args"][0].splitlines()
                    if "$KUBERAY_GEN_RAY_START_CMD" in line)
        label = re.search(r"--labels=(\S+)", join).group(1)
        for warm in ("true", "false"):
            assert label_utils.parse_node_labels_string(label.replace("$warm", warm)) == {
                "warmd.io/warm": warm}


def test_command_checker_catches_what_does_not_exist():
    with pytest.raises(AssertionError, match="no `warmd launch`"):
        check_cli(["warmd", "launch"])
    with pytest.raises(AssertionError, match="has no --detach"):
        check_cli(["warmd", "start", "--detach"])
    assert warmd_commands("a && /usr/bin/warmd stop --address x; b") == [
        ["/usr/bin/warmd", "stop", "--address", "x"]]


# --- systemd ---------------------------------------------------------------------------------

def test_systemd_unit():
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # systemd keys are case-sensitive
    unit.read_string((DEPLOY / "systemd" / "warmd.service").read_text())
    assert {"Unit", "Service", "Install"} <= set(unit.sections())
    service = unit["Service"]
    assert service["Type"] == "oneshot" and service["RemainAfterExit"] == "yes"
    assert unit["Install"]["WantedBy"] == "multi-user.target"
    assert unit["Unit"]["Description"]
    for key in ("ExecStart", "ExecStop"):
        tokens = shlex.split(service[key])
        assert Path(tokens[0]).is_absolute() and Path(tokens[0]).name == "warmd"
        check_cli(tokens)
    assert shlex.split(service["ExecStart"])[1] == "start"
    assert shlex.split(service["ExecStop"])[1] == "stop"
    for line in unit["Service"].get("Environment", "").splitlines() or [""]:
        for name in warmd_env_names(line):
            assert f'"{name}"' in SETTINGS


# --- Redis -----------------------------------------------------------------------------------

@contextlib.contextmanager
def redis_with_deploy_config(tmp_path, acl_text: str):
    """A real redis-server running deploy/redis/redis.conf, with only what must differ on a
    test machine overridden (later directives win): port, data dir, ACL file path."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed")
    acl = tmp_path / "users.acl"
    acl.write_text(acl_text)
    port = free_port()
    conf = tmp_path / "redis.conf"
    conf.write_text((DEPLOY / "redis" / "redis.conf").read_text()
                    + f"\nbind 127.0.0.1\nport {port}\ndir {tmp_path}\naclfile {acl}\n"
                    + "daemonize no\nappendonly no\n")
    proc = subprocess.Popen([binary, str(conf)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 10
        while not _answers(port):
            if proc.poll() is not None:
                pytest.fail(f"redis-server refused the config: {proc.stdout.read().decode()}")
            assert time.monotonic() < deadline, "redis-server did not come up"
            time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def client(port: int, **kw) -> redis.Redis:
    """No hidden retries: redis-py would retry a refused login for seconds."""
    return redis.Redis(port=port, socket_timeout=2, retry=Retry(NoBackoff(), 0), **kw)


def _answers(port: int) -> bool:
    try:
        client(port).ping()
    except redis.exceptions.AuthenticationError:
        return True  # it answered: the default user is off
    except redis.exceptions.ConnectionError:
        return False
    return True


def with_passwords(text: str) -> str:
    return "".join(line + (f" >{line.split()[1]}-pw" if line.startswith("user warmd-") else "")
                   + "\n" for line in text.splitlines())


def test_redis_acl_users_have_their_documented_rights(tmp_path):
    shipped = (DEPLOY / "redis" / "users.acl").read_text()
    with redis_with_deploy_config(tmp_path, with_passwords(shipped)) as port:
        writer = client(port, username="warmd-writer", password="warmd-writer-pw")
        reader = client(port, username="warmd-reader", password="warmd-reader-pw")
        writer.set("warmd:v1:probe", b"x")
        assert writer.eval("return redis.call('GET', KEYS[1])", 1, "warmd:v1:probe") == b"x"
        writer.publish("warmd:v1:pub:{fp}:t", "done")
        writer.info("memory")
        assert reader.get("warmd:v1:probe") == b"x" and reader.info("memory")
        pubsub = reader.pubsub()
        pubsub.subscribe("warmd:v1:pub:{fp}:t")
        pubsub.close()
        for denied in (lambda: reader.set("warmd:v1:probe", b"y"),
                       lambda: reader.publish("warmd:v1:pub:x", "y"),
                       lambda: writer.set("other:key", b"y"),
                       lambda: writer.flushall(),
                       lambda: writer.config_get("*")):
            with pytest.raises(redis.exceptions.NoPermissionError):
                denied()
        with pytest.raises(redis.exceptions.RedisError):  # the default user is off
            client(port).get("warmd:v1:probe")

        # warmd's own node records: the writer writes, the reader is refused and it is counted
        url = f"redis://warmd-writer:warmd-writer-pw@127.0.0.1:{port}/0"
        assert node_records(url, "acl").put(NodeState("n1"))
        read_only = node_records(f"redis://warmd-reader:warmd-reader-pw@127.0.0.1:{port}/0", "acl")
        assert not read_only.put(NodeState("n2")) and read_only.errors == 1
        assert "NOPERM" in read_only.last_error or "permission" in read_only.last_error.lower()
        assert [r.node_id for r in read_only.get_all()] == ["n1"]


def test_shipped_acl_users_cannot_log_in_until_given_a_password(tmp_path):
    with redis_with_deploy_config(tmp_path, (DEPLOY / "redis" / "users.acl").read_text()) as port:
        for user in ("warmd-writer", "warmd-reader", "default"):
            with pytest.raises(redis.exceptions.AuthenticationError):
                client(port, username=user, password="").ping()
