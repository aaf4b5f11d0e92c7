"""Store URLs whose userinfo holds an unencoded delimiter are refused, and
no child of warmd (a warmup worker, what it runs: ninja, nvcc) carries the store password in
its environment, while a child that opens the store still can."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest
from click.testing import CliRunner
from store_support import SRC, module_server

from warmd.cli import main
from warmd.store import free_port, parse_store_url
from warmd.store.credentials import url_without_secrets

PASSWORD = "harden-pw/#x"  # delimiters in it, percent-encoded in the URL
ENCODED = "harden-pw%2F%23x"
SIGNING_KEY = "signing-secret-0123"


server = module_server(PASSWORD)


@pytest.mark.parametrize("url", [
    "redis://writer:pw@127.0.0.1:{a}/#x@127.0.0.1:{b}/0",
    "redis://writer:p@w@127.0.0.1:{b}/0",
    "redis://writer:pw?@127.0.0.1:{b}/0",
    "rediss://:a/b@127.0.0.1:{b}/0",
], ids=["fragment-host", "at", "question", "slash"])
def test_unencoded_userinfo_delimiters_are_refused_with_a_hint(url, monkeypatch):
    url = url.format(a=free_port(), b=free_port())
    result = CliRunner().invoke(main, ["cache", "ls", "--redis", url])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "percent-encode" in result.output and result.output.count("\n") == 1
    assert "pw" not in result.output.replace("pw@", "") or "***" in result.output
    monkeypatch.setenv("WARMD_REDIS_URL", url)
    result = CliRunner().invoke(main, ["cache", "ls"])
    assert result.exit_code == 2 and "percent-encode" in result.output


def test_password_file_urls(tmp_path):
    secret = tmp_path / "pw"
    secret.write_text(PASSWORD + "\n")
    parsed = parse_store_url(f"redis://writer@h:1/0?password_file={secret}")
    assert "password_file" not in parsed.url and PASSWORD not in parsed.display
    import redis

    assert redis.connection.parse_url(parsed.url)["password"] == PASSWORD
    from warmd.errors import WarmdInputError

    with pytest.raises(WarmdInputError, match="cannot read"):
        parse_store_url(f"redis://h:1/0?password_file={tmp_path / 'missing'}")
    with pytest.raises(WarmdInputError, match="another password"):
        parse_store_url(f"redis://u:x@h:1/0?password_file={secret}")


# A process started with the secrets in its environment, as a user would start warmd: it
# opens the store (which moves them out), then starts a real warmup worker and, from it, a
# process standing for ninja/nvcc; reads their /proc/<pid>/environ; and has a plain child
# open the store from the inherited environment.
CHILD = r"""
import json, os, subprocess, sys, time
from warmd.executors.pool import Worker
from warmd.tasks import Task
from warmd.store import open_shared_cache

cache = open_shared_cache(node="parent")
parent_ok = cache.ping()
worker = Worker({})
worker.run(Task(key="x/none", library="no_such_library", kernel="k"))  # starts the process
grandchild = subprocess.Popen(["sleep", "30"])
envs = {}
for name, pid in (("worker", worker.pid), ("sleep", grandchild.pid)):
    for _ in range(100):  # until the child has exec'd (its environ is then filled in)
        with open(f"/proc/{pid}/environ", "rb") as fh:
            envs[name] = fh.read().decode(errors="replace")
        if "WARMD_" in envs[name]:
            break
        time.sleep(0.05)
grandchild.kill()
worker.stop()
probe = subprocess.run([sys.executable, "-c",
                        "from warmd.store import open_shared_cache; "
                        "print(open_shared_cache(node='child').ping())"],
                       capture_output=True, text=True)
from warmd import settings
print(json.dumps({"parent_ok": parent_ok, "envs": envs, "child": probe.stdout.strip(),
                  "key": (settings.signing_key() or b"").decode(),
                  "child_err": probe.stderr[-2000:], "url": os.environ["WARMD_REDIS_URL"]}))
"""


@pytest.mark.parametrize("key_as", ["file", "variable"])
def test_children_inherit_no_secret_and_can_still_reach_the_store(server, tmp_path, key_as):
    url = f"redis://default:{ENCODED}@127.0.0.1:{server.port}/0"
    key_file = tmp_path / "signing.key"
    key_file.write_text(SIGNING_KEY)
    env = {**os.environ, "WARMD_REDIS_URL": url, "WARMD_STATE_DIR": str(tmp_path / "state"),
           "PYTHONPATH": SRC}
    env.pop("WARMD_SIGNING_KEY", None)
    env.pop("WARMD_SIGNING_KEY_FILE", None)
    if key_as == "file":
        env["WARMD_SIGNING_KEY_FILE"] = str(key_file)
    else:
        env["WARMD_SIGNING_KEY"] = SIGNING_KEY
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["parent_ok"] is True and out["child"] == "True", out["child_err"]
    for name, environ in out["envs"].items():
        assert "WARMD_REDIS_URL=" in environ, name  # the variable is there, its secret not
        for secret in (PASSWORD, ENCODED, SIGNING_KEY):
            assert secret not in environ, (name, secret)
    assert ENCODED not in out["url"] and "password_file=" in out["url"]
    secrets = tmp_path / "state" / "secrets"
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o700
    for path in secrets.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    moved = [PASSWORD] if key_as == "file" else [PASSWORD, SIGNING_KEY]
    assert sorted(p.read_text() for p in secrets.iterdir()) == sorted(moved)
    assert out["key"] == SIGNING_KEY  # the process still signs with the key it was given


def test_url_without_secrets_moves_query_passwords_too(tmp_path, monkeypatch):
    monkeypatch.setenv("WARMD_STATE_DIR", str(tmp_path))
    safe = url_without_secrets("unix:///tmp/r.sock?db=0&password=s3cr3t")
    assert "s3cr3t" not in safe and parse_store_url(safe).url.endswith("password=s3cr3t")
    assert url_without_secrets("redis://h:1/0") == "redis://h:1/0"


def test_a_token_as_userinfo_never_reaches_children_and_still_authenticates(server, tmp_path):
    """redis://TOKEN@host (no ':'): redis-py sends TOKEN as the user name, which redaction
    hides as it may be a token; children get it from a 0600 file like a password."""
    token = "tok-hunter2-0123"
    admin = server.client()
    admin.acl_setuser(token, enabled=True, nopass=True, keys=["*"], channels=["*"],
                      commands=["+@all"])
    url = f"redis://{token}@127.0.0.1:{server.port}/0"
    env = {**os.environ, "WARMD_REDIS_URL": url, "WARMD_STATE_DIR": str(tmp_path / "state"),
           "PYTHONPATH": SRC}
    env.pop("WARMD_SIGNING_KEY", None)
    env.pop("WARMD_SIGNING_KEY_FILE", None)
    try:
        done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                              env=env, cwd=tmp_path, timeout=120)
    finally:
        admin.acl_deluser(token)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["parent_ok"] is True and out["child"] == "True", out["child_err"]
    for name, environ in out["envs"].items():
        assert "WARMD_REDIS_URL=" in environ and token not in environ, name
    assert token not in out["url"] and "username_file=" in out["url"]
    assert token not in parse_store_url(url).display
