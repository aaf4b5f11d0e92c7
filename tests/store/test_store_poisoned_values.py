"""Poisoned store values, against a real redis-server: values poisoned with a plain Redis
client, as an attacker with a writer account would, never fail a task, never get installed,
are counted, and the next correct publish heals them for every node."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from store_support import DirAdapter, compiles, module_server, task_entries, warm

from warmd.cli import main
from warmd.store import layout
from warmd.store.formats import accept_manifest, json_bytes
from warmd.store.signing import sign

KEY = b"cluster-key"


server = module_server("harden-pw")


CACHE_DEFAULTS = {"poll_interval": 0.05, "lease_seconds": 5.0}
PLAN = task_entries(1, per_task=2)
TASK = next(iter(PLAN))
NAMES = PLAN[TASK]


def cli(*args: str, code: int = 0):
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    assert code or result.exception is None, result.exception
    return result


def published(caches, url, tmp_path, key=None, node="writer"):
    """A node that compiled and published PLAN; returns (its cache, fingerprint digest)."""
    cache = caches(url, signing_key=key, node=node)
    adapter = DirAdapter(tmp_path / node)
    assert warm(cache, adapter, PLAN)["compiled"] == 2
    return cache, cache.fingerprint(adapter).digest


def node_warms(caches, url, root, key=None, node=None):
    """A fresh node warming PLAN: (what happened, its counters, the names it compiled)."""
    log = root.parent / f"{root.name}.log"
    cache = caches(url, signing_key=key, **({"node": node} if node else {}))
    counts = warm(cache, DirAdapter(root), PLAN, log=log)
    return counts, cache.stats.counters, compiles(log)


def poison_manifest(rclient, fp: str, name: str, edit) -> bytes:
    """Rewrite a stored manifest's JSON text with edit(text) -> text, as an attacker could."""
    key = layout.manifest_key(fp, name)
    raw = edit(rclient.get(key).decode()).encode()
    rclient.set(key, raw)
    return raw


def _replace_field(field: str, value: str):
    def edit(text: str) -> str:
        data = json.loads(text)
        data[field] = "@@"
        return json.dumps(data, sort_keys=True).replace('"@@"', value)
    return edit


DEEP = '{"a":' * 100_000 + "1" + "}" * 100_000
MANIFEST_POISONS = {
    "size-overflow": _replace_field("size", "1e999"),
    "chunk-size-infinity": _replace_field("chunk_size", "Infinity"),
    "version-overflow": _replace_field("v", "1e999"),
    "size-not-int": _replace_field("size", '"12"'),
    "deep-nesting": lambda _text: DEEP,
    "huge-string": lambda _text: '{"x": "' + "a" * (2 << 20) + '"}',
    "not-utf8": lambda _text: "\udcff",
}


# ----------------------------------------------------------------------------- class 1

@pytest.mark.parametrize("poison", sorted(MANIFEST_POISONS))
def test_malformed_manifest_is_a_counted_miss_then_healed(poison, server, rclient, caches,
                                                         tmp_path):
    _writer, fp = published(caches, server.url, tmp_path)
    edit = MANIFEST_POISONS[poison]
    key = layout.manifest_key(fp, NAMES[0])
    text = edit(rclient.get(key).decode())
    rclient.set(key, text.encode("utf-8", "surrogateescape"))
    counts, counters, built = node_warms(caches, server.url, tmp_path / "b")
    # the poisoned entry is built here; the intact one is installed, verified, from the store
    assert counts == {"local_hits": 0, "remote_hits": 1, "compiled": 1}
    assert built == [NAMES[0]]
    assert counters.get("corrupt_rejected", 0) >= 1 and "fetch_failed" not in counters
    # b's publication replaced the poisoned entry: every later node installs it
    counts, counters, built = node_warms(caches, server.url, tmp_path / "c")
    assert counts["remote_hits"] == 2 and built == []


@pytest.mark.parametrize("value", ["1e999", "Infinity", '"x"', "[" * 50_000 + "]" * 50_000],
                         ids=["overflow", "infinity", "string", "deep"])
def test_malformed_task_record_is_a_counted_miss_then_healed(value, server, rclient, caches,
                                                            tmp_path):
    _writer, fp = published(caches, server.url, tmp_path)
    key = layout.task_key(fp, TASK)
    data = json.loads(rclient.get(key))
    data["v"] = "@@"
    rclient.set(key, json.dumps(data).replace('"@@"', value))
    counts, counters, built = node_warms(caches, server.url, tmp_path / "b")
    # the record is refused; its entries' manifests verify: each installed, none rebuilt
    assert counts == {"local_hits": 0, "remote_hits": 2, "compiled": 0} and built == []
    assert counters.get("corrupt_rejected", 0) >= 1 and "fetch_failed" not in counters
    # b's record replaced the malformed one: the next node finds the task whole
    counts, counters, built = node_warms(caches, server.url, tmp_path / "c")
    assert counts["remote_hits"] == 2 and built == []
    assert counters["tasks_hit"] == 1 and "corrupt_rejected" not in counters


@pytest.mark.parametrize("sig", ["é" * 64, "abc", "A" * 64, "0" * 63 + "g"],
                         ids=["non-ascii", "short", "upper", "not-hex"])
def test_malformed_signature_is_refused_not_raised(sig, server, rclient, caches, tmp_path):
    _writer, fp = published(caches, server.url, tmp_path, key=KEY)
    for key in (layout.manifest_key(fp, NAMES[0]), layout.task_key(fp, TASK)):
        data = json.loads(rclient.get(key))
        data["sig"] = sig
        rclient.set(key, json.dumps(data, ensure_ascii=False).encode())
    counts, counters, built = node_warms(caches, server.url, tmp_path / "b", key=KEY)
    # the record and the first manifest are refused (the manifest quarantined): the first
    # entry is built here, the second, whose manifest verifies, installed
    assert counts == {"local_hits": 0, "remote_hits": 1, "compiled": 1}
    assert built == [NAMES[0]]
    assert counters["signature_rejected"] == 2 and counters["quarantined"] == 1
    assert "fetch_failed" not in counters
    counts, counters, built = node_warms(caches, server.url, tmp_path / "c", key=KEY)
    assert counts["remote_hits"] == 2 and built == []
    assert counters["tasks_hit"] == 1 and "signature_rejected" not in counters


def plant_admin_poison(rclient, fp: str, poison: str, wrong_type) -> str:
    """Poison the first entry's manifest, and turn the second's into a key of another Redis
    type with wrong_type(key); returns the second manifest's key."""
    poison_manifest(rclient, fp, NAMES[0], MANIFEST_POISONS[poison])
    second = layout.manifest_key(fp, NAMES[1])
    rclient.delete(second)
    wrong_type(second)
    return second


def test_admin_commands_report_and_remove_poisoned_keys(server, rclient, caches, tmp_path):
    _writer, fp = published(caches, server.url, tmp_path)
    second = plant_admin_poison(rclient, fp, "size-overflow",
                                lambda key: rclient.rpush(key, b"not a string"))
    rclient.set(layout.task_key(fp, TASK), DEEP)
    url = server.url
    listed = json.loads(cli("cache", "ls", "--json", "--redis", url).output)
    assert [e["entries"] for e in listed if e["fingerprint"] == fp] == [2]
    report = json.loads(cli("cache", "verify", "--json", "--redis", url, code=1).output)
    assert report["checked"] == 2 and len(report["bad"]) == 2
    report = json.loads(cli("cache", "verify", "--quarantine", "--json", "--redis", url,
                            code=1).output)
    assert report["quarantined"] == 2
    assert not rclient.exists(layout.manifest_key(fp, NAMES[0])) and not rclient.exists(second)
    assert rclient.exists(layout.quarantine_key(fp, NAMES[1]))
    cli("cache", "stats", "--json", "--redis", url)
    cli("cache", "export", str(tmp_path / "x.tar"), "--redis", url)
    # the next correct publish heals the entry
    counts, _counters, built = node_warms(caches, server.url, tmp_path / "b")
    assert counts["compiled"] == 2
    counts, _counters, built = node_warms(caches, server.url, tmp_path / "c")
    assert counts["remote_hits"] == 2 and built == []


def test_prune_removes_undecodable_manifests(server, rclient, caches, tmp_path):
    _writer, fp = published(caches, server.url, tmp_path)
    second = plant_admin_poison(rclient, fp, "deep-nesting",
                                lambda key: rclient.hset(key, "x", "y"))
    report = json.loads(cli("cache", "prune", "--json", "--redis", server.url).output)
    assert report["malformed_removed"] == 2
    assert not rclient.exists(layout.manifest_key(fp, NAMES[0])) and not rclient.exists(second)


def test_future_manifest_version_is_kept_by_prune(server, rclient, caches, tmp_path):
    _writer, fp = published(caches, server.url, tmp_path)
    poison_manifest(rclient, fp, NAMES[0], _replace_field("v", "2"))
    report = json.loads(cli("cache", "prune", "--json", "--redis", server.url).output)
    assert report["malformed_removed"] == 0
    assert rclient.exists(layout.manifest_key(fp, NAMES[0]))


def test_signed_records_survive_the_decoder(server, rclient, caches, tmp_path):
    _writer, fp = published(caches, server.url, tmp_path, key=KEY)
    raw = rclient.get(layout.manifest_key(fp, NAMES[0]))
    assert accept_manifest(raw, key=KEY, max_size=1 << 30, fp=fp, name=NAMES[0])
    assert sign(json.loads(raw), KEY) == json.loads(raw)


# ----------------------------------------------------------------------------- class 2, 3

def test_a_node_with_the_wrong_key_never_overwrites_valid_records(server, rclient, caches,
                                                                  tmp_path):
    _writer, fp = published(caches, server.url, tmp_path, key=KEY)
    record = rclient.get(layout.task_key(fp, TASK))
    manifests = {n: rclient.get(layout.manifest_key(fp, n)) for n in NAMES}
    counts, counters, built = node_warms(caches, server.url, tmp_path / "b", key=b"wrong")
    assert counts["compiled"] == 2 and sorted(built) == sorted(NAMES)
    assert counters["signature_rejected"] >= 1 and "quarantined" not in counters
    assert counters["publish_blocked"] == 3  # two manifests and the task record
    assert rclient.get(layout.task_key(fp, TASK)) == record
    assert {n: rclient.get(layout.manifest_key(fp, n)) for n in NAMES} == manifests
    counts, _counters, built = node_warms(caches, server.url, tmp_path / "c", key=KEY)
    assert counts["remote_hits"] == 2 and built == []  # A, B, A: the third hits


def test_planted_unsigned_manifest_is_quarantined_and_replaced(server, rclient, caches,
                                                               tmp_path):
    _writer, fp = published(caches, server.url, tmp_path, key=KEY)
    key = layout.manifest_key(fp, NAMES[0])
    data = json.loads(rclient.get(key))
    del data["sig"]
    rclient.set(key, json_bytes(data), px=50_000)
    # a node with another key refuses it, leaves it, and does not renew its TTL
    node_warms(caches, server.url, tmp_path / "w", key=b"wrong")
    assert 0 < rclient.pttl(key) <= 50_000
    assert json.loads(rclient.get(key)) == data
    counts, counters, built = node_warms(caches, server.url, tmp_path / "b", key=KEY)
    assert counts["compiled"] == 1 and built == [NAMES[0]]  # the other: verified, installed
    assert counters["signature_rejected"] == 1 and counters["quarantined"] == 1
    assert json.loads(rclient.get(layout.quarantine_key(fp, NAMES[0])))["manifest"] == data
    assert "sig" in json.loads(rclient.get(key))  # republished, signed
    counts, _counters, built = node_warms(caches, server.url, tmp_path / "c", key=KEY)
    assert counts["remote_hits"] == 2 and built == []


def test_a_refused_manifest_found_before_building_is_quarantined_then_healed(
        server, rclient, caches, tmp_path):
    """The node reads each kernel's manifest before claiming it: an unsigned one is
    quarantined there (kept for operators), the kernel built, and its publication heals."""
    writer = caches(server.url, signing_key=KEY, node="first")
    adapter = DirAdapter(tmp_path / "a")
    fp = writer.fingerprint(adapter).digest
    planted = json_bytes({"library": "testlib", "name": NAMES[0], "fingerprint": fp,
                          "digest": "0" * 64, "size": 1, "producer": "mallory"})
    rclient.set(layout.manifest_key(fp, NAMES[0]), planted)
    assert warm(writer, adapter, PLAN)["compiled"] == 2
    assert writer.stats.counters["quarantined"] == 1 and writer.stats.counters["published"] == 2
    assert json.loads(rclient.get(layout.quarantine_key(fp, NAMES[0])))["manifest"][
        "producer"] == "mallory"
    counts, _counters, built = node_warms(caches, server.url, tmp_path / "c", key=KEY)
    assert counts["remote_hits"] == 2 and built == []


@pytest.mark.parametrize("signed", [False, True], ids=["unsigned", "signed"])
def test_keys_of_the_wrong_redis_type_are_counted_and_replaced(signed, server, rclient,
                                                               caches, tmp_path):
    key = KEY if signed else None
    _writer, fp = published(caches, server.url, tmp_path, key=key)
    man_key, rec_key = layout.manifest_key(fp, NAMES[0]), layout.task_key(fp, TASK)
    rclient.delete(man_key, rec_key)
    rclient.rpush(man_key, b"a", b"b")
    rclient.hset(rec_key, "entries", "x")
    counts, counters, built = node_warms(caches, server.url, tmp_path / "b", key=key)
    # the record is refused; the list is no manifest (the entry is claimed and built
    # here, and its publication replaces the list); the second entry is installed
    assert counts == {"local_hits": 0, "remote_hits": 1, "compiled": 1}
    assert built == [NAMES[0]]
    assert counters["corrupt_rejected"] >= 1 and "fetch_failed" not in counters
    assert counters["replaced"] == 1
    assert rclient.type(man_key) == b"string" and rclient.type(rec_key) == b"string"
    counts, counters, built = node_warms(caches, server.url, tmp_path / "c", key=key)
    assert counts["remote_hits"] == 2 and built == []
    assert counters["tasks_hit"] == 1 and "corrupt_rejected" not in counters


def test_refused_reads_renew_no_ttl(server, rclient, caches, tmp_path):
    _writer, fp = published(caches, server.url, tmp_path, key=KEY)
    keys = [layout.task_key(fp, TASK), *(layout.manifest_key(fp, n) for n in NAMES)]
    for key in keys:
        rclient.pexpire(key, 40_000)
    caches(server.url, signing_key=b"wrong").entries.fetch_task(DirAdapter(tmp_path / "w"), TASK)
    assert all(0 < rclient.pttl(k) <= 40_000 for k in keys)
    reader = caches(server.url, signing_key=KEY)
    assert reader.entries.fetch_task(DirAdapter(tmp_path / "r"), TASK) == NAMES
    assert all(rclient.pttl(k) > 40_000 for k in keys)  # a verified read renews them
