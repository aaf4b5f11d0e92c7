"""deploy/'s Redis: the StatefulSet serves what the KubeRay secrets point at, the generated
secrets log in to the shipped redis-server, and the shipped ACL users get exactly the rights
they are documented to have (a real redis-server with deploy/redis's config)."""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import time

import pytest
import redis
from deploy_support import DEPLOY, generated_secrets, kuberay_objects
from redis.backoff import NoBackoff
from redis.retry import Retry

from warmd import settings
from warmd.cluster.state import NodeState, node_records
from warmd.store import free_port


def redis_directives(text: str) -> dict[str, str]:
    return dict(line.split(None, 1) for line in text.splitlines()
                if line.strip() and not line.startswith("#"))


def test_the_redis_statefulset_serves_what_the_secrets_point_at():
    made = {(d["kind"], d["metadata"]["name"]): d for d in kuberay_objects()}
    shipped = (DEPLOY / "redis" / "redis.conf").read_text()
    assert made["ConfigMap", "warmd-redis-conf"]["data"]["redis.conf"] == shipped
    conf = redis_directives(shipped)
    statefulset = made["StatefulSet", "redis"]
    pod = statefulset["spec"]["template"]["spec"]
    [container] = pod["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert container["command"] == ["redis-server", f"{mounts['conf']}/redis.conf"]
    [item] = volumes["acl"]["secret"]["items"]
    assert f"{mounts['acl']}/{item['path']}" == conf["aclfile"]
    assert mounts["data"] == conf["dir"]
    assert [t["metadata"]["name"] for t in statefulset["spec"]["volumeClaimTemplates"]] == [
        "data"]
    assert container["ports"][0]["containerPort"] == int(conf["port"])
    maxmemory = int(conf["maxmemory"].removesuffix("gb")) * 2**30
    limit = container["resources"]["limits"]["memory"]
    assert int(limit.removesuffix("Gi")) * 2**30 > maxmemory
    service = made["Service", statefulset["spec"]["serviceName"]]
    assert service["spec"]["selector"] == pod.get("metadata", statefulset["spec"]["template"][
        "metadata"])["labels"]
    host = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc:" \
           f"{service['spec']['ports'][0]['port']}"
    for name in ("warmd-redis", "warmd-redis-reader"):
        assert f"@{host}/0" in made["Secret", name]["stringData"]["url"]


def _local(url: str, port: int) -> str:
    return re.sub(r"@[^/]+/", f"@127.0.0.1:{port}/", url)


def test_generated_secrets_log_in_to_the_shipped_redis(tmp_path, monkeypatch):
    """secrets.sh's ACL file (hashes only) loaded by a real redis-server with the shipped
    redis.conf; warmd's URLs log in with their user's rights; the key signs."""
    first, second = generated_secrets(), generated_secrets()
    secrets = {d["metadata"]["name"]: d["stringData"] for d in first}
    assert all(a["stringData"] != b["stringData"] for a, b in zip(first, second, strict=True))
    writer_url, reader_url = secrets["warmd-redis"]["url"], secrets["warmd-redis-reader"]["url"]
    acl = secrets["warmd-redis-acl"]["users.acl"]
    for url in (writer_url, reader_url):
        assert url.split(":")[2].split("@")[0] not in acl  # the ACL holds hashes only
    with redis_with_deploy_config(tmp_path, acl) as port:
        writer = node_records(_local(writer_url, port), "k8s")
        assert writer.put(NodeState("n1")), writer.last_error
        reader = node_records(_local(reader_url, port), "k8s")
        assert not reader.put(NodeState("n2")) and "no permissions" in reader.last_error
        assert [r.node_id for r in reader.get_all()] == ["n1"]
        with pytest.raises(redis.exceptions.AuthenticationError):
            client(port, username="warmd-writer", password="wrong").ping()
    key_file = tmp_path / "key"
    key_file.write_text(secrets["warmd-signing-key"]["key"])
    monkeypatch.setenv("WARMD_SIGNING_KEY_FILE", str(key_file))
    assert re.fullmatch(rb"[0-9a-f]{64}", settings.signing_key())


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
