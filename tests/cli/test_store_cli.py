"""`warmd cache ...` against a real redis-server."""

from __future__ import annotations

import io
import json
import tarfile
import time

import pytest
from click.testing import CliRunner
from store_support import DirAdapter, module_server, task_entries, warm

from warmd.cli import main
from warmd.stats import LABEL_WIDTH, VALUE_WIDTH
from warmd.store import layout, open_shared_cache
from warmd.store.formats import Manifest

server = module_server("cli-secret")


@pytest.fixture
def url(server):
    client = server.client()
    client.flushall()
    client.close()
    return server.url


def run(*args: str, code: int = 0):
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    return result


def _fill(url: str, tmp_path, tasks: int = 3, key: bytes | None = None) -> str:
    cache = open_shared_cache(url, node="filler", signing_key=key)
    adapter = DirAdapter(tmp_path / "filled")
    warm(cache, adapter, task_entries(tasks))
    fp = cache.fingerprint(adapter).digest
    cache.close()
    return fp


def test_fingerprint_json_and_namespace(monkeypatch):
    first = json.loads(run("cache", "fingerprint", "--target", "h200", "--library", "deep_gemm",
                           "--json").output)
    monkeypatch.setenv("WARMD_NAMESPACE", "team-b")
    second = json.loads(run("cache", "fingerprint", "--target", "h200", "--library",
                            "deep_gemm", "--json").output)
    assert first[0]["inputs"]["sms"] == 132 and second[0]["inputs"]["namespace"] == "team-b"
    assert first[0]["digest"] != second[0]["digest"]
    text = run("cache", "fingerprint", "--target", "h20", "--library", "deep_gemm").output
    assert text.startswith("deep_gemm  ") and "sms                78" in text


@pytest.mark.parametrize("args", [
    ("cache", "fingerprint", "--target", "h200", "--library", "nope"),
    ("cache", "fingerprint", "--target", "h200", "--library", "nvcc"),
    ("cache", "stats", "--redis", "ftp://user:hunter2@host"),
    ("cache", "prune", "--all", "--redis", "redis://127.0.0.1:1"),
    ("cache", "import", "/nonexistent.tar", "--redis", "redis://127.0.0.1:1"),
])
def test_bad_input_is_one_line_exit_2(args):
    result = run(*args, code=2)
    assert result.output.count("\n") == 1 and result.output.startswith("warmd: error: ")
    assert "hunter2" not in result.output


def test_unreachable_store_is_one_line_without_the_password():
    from warmd.store import free_port

    result = run("cache", "stats", "--redis", f"redis://:hunter2@127.0.0.1:{free_port()}/0",
                 code=1)
    assert "unreachable" in result.output and "hunter2" not in result.output
    assert result.output.strip().count("\n") == 0


def test_stats_and_ls(url, tmp_path):
    fp = _fill(url, tmp_path)
    other = open_shared_cache(url, node="second")
    warm(other, DirAdapter(tmp_path / "second"), task_entries(3))
    other.close()
    data = json.loads(run("cache", "stats", "--json", "--redis", url).output)
    assert data["totals"]["compiled"] == 6 and data["totals"]["remote_hits"] == 6
    assert set(data["nodes"]) == {"filler", "second"} and data["hit_rate"] == 0.5
    assert "cli-secret" not in data["store"]
    text = run("cache", "stats", "--redis", url).output
    assert "remote hits" in text and "Per node" in text and "cli-secret" not in text
    listed = json.loads(run("cache", "ls", "--json", "--redis", url).output)
    assert listed[0]["fingerprint"] == fp and listed[0]["entries"] == 6
    assert listed[0]["bytes"] > 6 * 100_000
    entries = json.loads(run("cache", "ls", "--fingerprint", fp, "--json", "--redis",
                             url).output)
    assert len(entries) == 6 and all(e["state"] == "ok" and e["producer"] == "filler"
                                     for e in entries)
    assert "Entries of" in run("cache", "ls", "--fingerprint", fp, "--redis", url).output


def test_stats_tables_at_80_columns_keep_every_header_and_name_whole(url, tmp_path):
    """Columns are left out (the JSON has them all) before a header or a node name is cut;
    a fingerprint is shortened in the middle, its head and tail kept. Every counter's value
    ends in one column, whatever its label."""
    _fill(url, tmp_path)
    result = CliRunner(env={"COLUMNS": "80"}).invoke(main, ["cache", "stats", "--redis", url])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    listing = lines[2:lines.index(next(x for x in lines if x.startswith("Key proof")))]
    assert len(listing) >= 30
    end = LABEL_WIDTH + VALUE_WIDTH
    for line in listing:  # "label   value", a counter's share or the store's size after it
        assert line[LABEL_WIDTH - 1] == " " and line[end - 1] != " ", line
        assert line[end:end + 1] in ("", " ", ","), line
    headers = " ".join(line for line in lines if line.startswith("┃"))
    assert "…" not in headers and "node" in headers and "hit rate" in headers
    assert any("filler" in line for line in lines if line.startswith("│"))


def test_verify_finds_and_quarantines_corruption(url, server, tmp_path):
    fp = _fill(url, tmp_path)
    assert "6 entries checked: 6 ok, 0 bad" in run("cache", "verify", "--redis", url).output
    client = server.client()
    name = task_entries(3)["testlib/gemm/1"][0]
    man = Manifest.decode(client.get(layout.manifest_key(fp, name)), 1 << 30)
    chunk = layout.blob_key(man.digest, 0)
    data = client.get(chunk)
    client.set(chunk, data[:100] + bytes([data[100] ^ 0x40]) + data[101:])
    report = json.loads(run("cache", "verify", "--json", "--redis", url, code=1).output)
    assert report["ok"] == 5 and report["bad"][0]["name"] == name
    assert "digest mismatch" in report["bad"][0]["reason"]
    run("cache", "verify", "--quarantine", "--redis", url, code=1)
    assert client.get(layout.manifest_key(fp, name)) is None
    assert "5 entries checked: 5 ok" in run("cache", "verify", "--redis", url).output
    client.close()


def test_prune_old_disowned_and_orphans(url, server, tmp_path):
    fp = _fill(url, tmp_path)
    client = server.client()
    names = [n for ns in task_entries(3).values() for n in ns]
    client.set(layout.used_key(fp, names[0]), str(time.time() - 10 * 86400))
    client.delete(layout.manifest_key(fp, names[1]))  # expired or evicted
    dry = json.loads(run("cache", "prune", "--older-than", "7", "--dry-run", "--json",
                         "--redis", url).output)
    assert dry["entries_removed"] == 1 and dry["stale_index"] == 1
    indexed = f"{layout.used_prefix(fp)}*"
    assert len(list(client.scan_iter(match=indexed))) == 6
    done = json.loads(run("cache", "prune", "--older-than", "7", "--json", "--redis",
                          url).output)
    assert done["entries_removed"] == 1 and done["task_records_removed"] == 1
    assert len(list(client.scan_iter(match=indexed))) == 4
    assert done["orphan_blobs_removed"] == 0  # just orphaned: could be a publish in flight
    # Orphaned blobs go once they are older than a publication in flight could be.
    for key in client.scan_iter(match="warmd:v1:blob:*"):
        client.pexpire(key, 1000 * 86400)
    assert json.loads(run("cache", "prune", "--json", "--redis", url).output)[
        "orphan_blobs_removed"] == 2
    assert len(list(client.scan_iter(match="warmd:v1:blob:*"))) == 4
    # Disown a namespace: everything of its fingerprints goes.
    run("cache", "prune", "--namespace", "nope", "--all", "--redis", url, code=2)
    gone = json.loads(run("cache", "prune", "--namespace", "default", "--all", "--json",
                          "--redis", url).output)
    assert gone["fingerprints_removed"] == 1 and gone["entries_removed"] == 4
    assert not list(client.scan_iter(match="warmd:v1:man:*"))
    assert not list(client.scan_iter(match="warmd:v1:task:*"))
    client.close()


def test_export_import_roundtrip_verifies_and_refuses(url, server, tmp_path):
    fp = _fill(url, tmp_path, key=b"k1")
    archive = tmp_path / "cache.tar"
    out = json.loads(run("cache", "export", str(archive), "--json", "--redis", url).output)
    assert out["entries"] == 6 and out["tasks"] == 3
    client = server.client()
    client.flushall()
    monkey_env = {"WARMD_SIGNING_KEY": "k1"}
    result = CliRunner(env=monkey_env).invoke(main, ["cache", "import", str(archive), "--json",
                                                     "--redis", url])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["imported"] == 6
    fetched = DirAdapter(tmp_path / "after-import")
    cache = open_shared_cache(url, signing_key=b"k1")
    assert warm(cache, fetched, task_entries(3))["remote_hits"] == 6
    cache.close()

    # Wrong key, and a tampered blob: refused and counted, nothing else lost.
    client.flushall()
    tampered = tmp_path / "tampered.tar"
    with tarfile.open(archive) as src, tarfile.open(tampered, "w") as dst:
        first_blob = True
        for member in src.getmembers():
            data = src.extractfile(member).read()
            if member.name.startswith("blob/") and first_blob:
                data, first_blob = data[:-1] + bytes([data[-1] ^ 1]), False
            dst.addfile(member, io.BytesIO(data))
    result = CliRunner(env=monkey_env).invoke(main, ["cache", "import", str(tampered),
                                                     "--json", "--redis", url])
    counts = json.loads(result.stdout)
    assert counts["imported"] == 5 and counts["corrupt_rejected"] == 1
    assert counts["tasks"] == 2 and counts["tasks_skipped"] == 1  # it names the bad entry
    client.flushall()
    result = CliRunner(env={"WARMD_SIGNING_KEY": "other"}).invoke(
        main, ["cache", "import", str(archive), "--json", "--redis", url])
    counts = json.loads(result.stdout)
    assert counts["imported"] == 0 and counts["tasks"] == 0
    assert counts["signature_rejected"] == 9  # 6 manifests and 3 task records
    assert not list(client.scan_iter(match="warmd:v1:man:*"))
    assert fp
    client.close()


def test_import_refuses_unsafe_archives_writing_nothing(url, server, tmp_path):
    client = server.client()
    header = json.dumps({"format": "warmd-cache-export", "version": 1}).encode()
    for bad in ("../escape", "/etc/passwd", "blob/../../x", "man/abc/../../y.json"):
        archive = tmp_path / "evil.tar"
        with tarfile.open(archive, "w") as tar:
            for name, data in (("warmd-export.json", header), (bad, b"owned")):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        result = run("cache", "import", str(archive), "--redis", url, code=2)
        assert "refusing" in result.output
        assert client.dbsize() == 0
    with tarfile.open(archive, "w") as tar:
        info = tarfile.TarInfo("warmd-export.json")
        info.size = len(header)
        tar.addfile(info, io.BytesIO(header))
        link = tarfile.TarInfo(f"blob/{'a' * 64}")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    assert "not a regular file" in run("cache", "import", str(archive), "--redis", url,
                                       code=2).output
    assert client.dbsize() == 0 and not (tmp_path / "escape").exists()
    client.close()


def test_server_commands_and_status_exits_3_when_not_running(tmp_path, monkeypatch):
    monkeypatch.setenv("WARMD_STATE_DIR", str(tmp_path / "state"))
    assert "not running" in run("cache", "server", "status", code=3).output
    assert json.loads(run("cache", "server", "status", "--json", code=3).output) == \
        {"running": False}
    started = json.loads(run("cache", "server", "start", "--json").output)
    assert started["running"] and ":***@" in started["url"]
    assert json.loads(run("cache", "server", "status", "--json").output)["pid"] == \
        started["pid"]
    assert "stopped" in run("cache", "server", "stop").output
    assert "not running" in run("cache", "server", "status", code=3).output


# ----- which store a command talks to: the daemon's, never one it starts -----

def _config_file(tmp_path, url: str | None, **extra) -> str:
    path = tmp_path / "warmd.yaml"
    path.write_text(json.dumps({"version": 1, "models": [{"path": "llama-3.1-8b"}],
                                "redis": {"url": url, **extra.pop("redis", {})}, **extra}))
    return str(path)


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    """A state dir of its own, and none of the caller's store or config variables."""
    for name in ("WARMD_REDIS_URL", "WARMD_CONFIG", "WARMD_NAMESPACE",
                 "WARMD_SIGNING_KEY", "WARMD_SIGNING_KEY_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WARMD_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def test_store_commands_start_no_server_and_say_how_to_get_one(state_dir, tmp_path):
    from warmd.store import embedded_status

    (tmp_path / "some.tar").write_bytes(b"")
    for args in (["stats"], ["ls"], ["ls", "--learned"], ["verify"], ["prune", "--dry-run"],
                 ["export", str(tmp_path / "out.tar")], ["import", str(tmp_path / "some.tar")]):
        result = run("cache", *args, code=1)
        [line] = result.output.splitlines()
        assert line.startswith("warmd: error: no shared cache is running") and \
            "`warmd cache server start`" in line, args
    assert embedded_status() is None and not (state_dir / "redis" / "server.json").exists()
    plan = run("plan", "--model", "llama-3.1-8b", "--target", "h200", "--learned", code=1)
    assert "no shared cache is running" in plan.output and embedded_status() is None


def test_store_commands_read_the_config_and_the_running_daemons_store(url, state_dir,
                                                                      tmp_path, monkeypatch):
    from warmd.cluster.command_store import record_store
    from warmd.config.load import load_config

    _fill(url, tmp_path)
    config = _config_file(tmp_path, url)
    for args in (["--config", config], ["-c", config]):
        stats = json.loads(run("cache", "stats", "--json", *args).output)
        assert set(stats["nodes"]) == {"filler"}
    monkeypatch.setenv("WARMD_CONFIG", config)
    assert json.loads(run("cache", "ls", "--json").output)[0]["entries"] == 6
    monkeypatch.delenv("WARMD_CONFIG")
    run("cache", "stats", code=1)  # no daemon: the embedded default, not running
    # what `warmd start --config` records: the store the daemon runs with
    record_store(load_config(config), url, embedded=False)
    recorded = state_dir / "daemon.json"
    assert recorded.stat().st_mode & 0o777 == 0o600  # the URL may hold a password
    assert json.loads(run("cache", "stats", "--json").output)["totals"]["compiled"] == 6
    assert "6 entries checked: 6 ok" in run("cache", "verify").output
    # an explicit store still wins over the daemon's
    assert "unreachable" in run("cache", "stats", "--redis", "redis://127.0.0.1:1/0",
                                code=1).output


def test_store_commands_take_the_configs_namespace_and_signing_key(url, state_dir, tmp_path):
    _fill(url, tmp_path, key=b"k1")
    (tmp_path / "k1").write_text("k1\n")
    (tmp_path / "k2").write_text("k2\n")
    signed = _config_file(tmp_path, url, signing_key_file=str(tmp_path / "k1"))
    assert "6 entries checked: 6 ok, 0 bad" in run("cache", "verify", "-c", signed).output
    other = _config_file(tmp_path, url, signing_key_file=str(tmp_path / "k2"))
    report = json.loads(run("cache", "verify", "-c", other, "--json", code=1).output)
    assert report["ok"] == 0 and "signature" in report["bad"][0]["reason"]
    team = _config_file(tmp_path, url, redis={"namespace": "team-b"})
    printed = json.loads(run("cache", "fingerprint", "-c", team, "--target", "h200",
                             "--library", "deep_gemm", "--json").output)
    assert printed[0]["inputs"]["namespace"] == "team-b"


def test_stop_ends_the_embedded_server_warmd_started_not_the_users(state_dir):
    from warmd.cluster.client import effective_redis_url
    from warmd.cluster.local_head import stop_local_services
    from warmd.config.load import load_config
    from warmd.store import StartedBy, embedded_status, ensure_embedded, stop_embedded

    config = load_config()  # the embedded default: redis.url null
    try:
        ensure_embedded(started_by=StartedBy.WARMUP)  # a warmup's, then the daemon's
        url, embedded = effective_redis_url(config)
        assert embedded and embedded_status().url == url
        assert stop_local_services() == ["embedded Redis (data kept)"]
        assert embedded_status() is None

        started = json.loads(run("cache", "server", "start", "--json").output)
        assert started["started_by"] == "warmd cache server start"
        effective_redis_url(config)
        assert stop_local_services() == []  # the user's: it stays up
        assert embedded_status().pid == started["pid"]
    finally:
        stop_embedded()


def test_stats_say_what_they_count_and_show_the_stores_capacity(url, server, tmp_path):
    _fill(url, tmp_path)
    client = server.client()
    client.config_set("maxmemory", str(64 << 20))
    data = json.loads(run("cache", "stats", "--json", "--redis", url).output)
    assert data["store_size"]["maxmemory"] == 64 << 20 and data["store_size"]["keys"] > 0
    result = CliRunner(env={"COLUMNS": "200"}).invoke(main, ["cache", "stats", "--redis", url])
    text = result.stdout
    assert "Totals (every warmup since the store began)" in text
    assert "64.0 MiB maxmemory" in text and "% used" in text
    # one meaning per name: "published" is bytes (the node table, the Published line); the
    # fingerprint table counts entries as "publications"
    headers = [line for line in text.splitlines() if line.startswith("┃")]
    assert "published" in headers[0] and "publications" in headers[1]
    client.config_set("maxmemory", "0")
    assert "no limit (maxmemory 0)" in run("cache", "stats", "--redis", url).output
    client.close()


def test_ls_at_80_columns_keeps_fingerprints_and_entry_names_whole(url, tmp_path):
    fp = _fill(url, tmp_path)
    names = [n for ns in task_entries(3).values() for n in ns]
    narrow = CliRunner(env={"COLUMNS": "80"})
    for args, wanted in ((["cache", "ls"], [fp]), (["cache", "ls", "--fingerprint", fp], names)):
        result = narrow.invoke(main, [*args, "--redis", url])
        assert result.exit_code == 0, result.output
        lines = result.stdout.splitlines()
        assert max(len(line) for line in lines) <= 80 and "…" not in result.stdout
        for name in wanted:
            assert any(f" {name} " in line for line in lines), (name, result.stdout)
