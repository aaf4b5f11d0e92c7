"""The cluster's key proof against a real redis-server: once warmd:v1:keyproof is gone
(deleted by a keyless writer, evicted), a node with another key claims nothing, quarantines
nothing, replaces nothing and publishes nothing, while a node with the cluster's key writes
the proof again; a proof of another key is an alarm, never an authority."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from store_support import DirAdapter, compile_entry, compiles, module_server, task_entries, warm

from warmd.cli import main
from warmd.store import history, layout
from warmd.store.formats import Manifest
from warmd.store.signing import KeyProof, key_proof

KEY = b"cluster-key"
WRONG = b"another-key"

server = module_server("keyproof-pw")

CACHE_DEFAULTS = {"poll_interval": 0.05, "lease_seconds": 5.0}
PLAN = task_entries(2, per_task=2, prefix="p")
NAMES = sorted(n for names in PLAN.values() for n in names)
# What a node's warmup may change without changing the cluster's entries: its counters,
# the shard-order arrivals.
# Counters, the compile-time history, shard order and the TTL-renewal marker (a node that read
# and verified renews the TTLs of what it used: bookkeeping, not a change to any entry), and
# the fingerprint list of before, which only that renewal writes now.
_BOOKKEEPING = (f"{layout.PREFIX}counts:", history.HISTORY_KEY, f"{layout.PREFIX}arrivals:",
                layout.STORE_ID_KEY, f"{layout.PREFIX}renewed:", layout.FPS_KEY)


def entries_state(rclient) -> dict[bytes, tuple]:
    """Every key of the cluster's entries with its type and value (a zset: its members; an
    entry's used key: only that it is there; a read that verified renews their scores and
    last-use times)."""
    out = {}
    for key in rclient.scan_iter(match=f"{layout.PREFIX}*"):
        if key.decode().startswith(_BOOKKEEPING):
            continue
        kind = rclient.type(key)
        value = (None if key.decode().startswith(f"{layout.PREFIX}used:") else
                 rclient.get(key) if kind == b"string" else
                 frozenset(rclient.zrange(key, 0, -1)) if kind == b"zset" else None)
        out[key] = (kind, value)
    return out


def warms(caches, url, root, key, node):
    """A fresh node warming PLAN: (kernel counts, its store counters, what it compiled)."""
    log = root.parent / f"{root.name}.log"
    cache = caches(url, signing_key=key, node=node)
    counts = warm(cache, DirAdapter(root), PLAN, log=log)
    return counts, cache.stats.counters, compiles(log)


@pytest.fixture
def cluster(server, rclient, caches, tmp_path):
    """A cluster whose key holder published PLAN; returns its fingerprint digest."""
    counts, _counters, _built = warms(caches, server.url, tmp_path / "a", KEY, "first")
    assert counts["compiled"] == len(NAMES)
    assert rclient.get(layout.KEY_PROOF_KEY) == key_proof(KEY)
    return caches(server.url).fingerprint(DirAdapter(tmp_path / "a")).digest


def test_a_wrong_key_node_after_the_proof_is_deleted_changes_nothing(server, rclient, caches,
                                                                     cluster, tmp_path):
    rclient.delete(layout.KEY_PROOF_KEY)  # a keyless writer
    before = entries_state(rclient)
    counts, counters, built = warms(caches, server.url, tmp_path / "w", WRONG, "wrong")
    assert counts["compiled"] == len(NAMES) and sorted(built) == NAMES
    assert counters["signature_rejected"] >= 1
    assert "quarantined" not in counters and "replaced" not in counters
    assert "published" not in counters and counters["publish_blocked"] >= 1
    assert entries_state(rclient) == before  # no proof claimed, nothing moved or written
    # a node with the cluster's key writes the proof again and finds every entry
    counts, counters, built = warms(caches, server.url, tmp_path / "r", KEY, "right")
    assert counts["remote_hits"] == len(NAMES) and built == []
    assert rclient.get(layout.KEY_PROOF_KEY) == key_proof(KEY)


def test_a_wrong_key_node_never_heals_what_it_refuses_while_the_proof_is_missing(
        server, rclient, caches, cluster, tmp_path):
    """The wrong-key node refuses the cluster's manifests once it reads them (a task record
    it cannot verify gives it no manifest to read: this reads them directly)."""
    rclient.delete(layout.KEY_PROOF_KEY)
    before = entries_state(rclient)
    wrong = caches(server.url, signing_key=WRONG, node="wrong")
    adapter = DirAdapter(tmp_path / "w")
    fp = wrong.fingerprint(adapter)
    assert wrong.entries.read_manifests(fp, list(NAMES)) == {}
    assert wrong.key_proof is KeyProof.MISSING
    assert "quarantined" not in wrong.stats.counters
    assert wrong.stats.counters["signature_rejected"] == len(NAMES)
    assert entries_state(rclient) == before


def test_the_clusters_key_writes_an_evicted_proof_again(server, rclient, caches, cluster,
                                                        tmp_path):
    """allkeys-lru evicts the proof like any key (it has no TTL, so volatile-lru never
    does): the first node with the cluster's key to open the store writes it again."""
    client = server.client()
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory-policy", "allkeys-lru")
    client.config_set("maxmemory", str(used + (4 << 20)))
    try:
        filler = b"x" * 4096
        for i in range(20_000):
            client.set(f"filler:{i}", filler)
            if i % 500 == 0 and not client.exists(layout.KEY_PROOF_KEY):
                break
        assert not client.exists(layout.KEY_PROOF_KEY), "allkeys-lru kept the proof"
    finally:
        client.config_set("maxmemory", "0")
        client.config_set("maxmemory-policy", "noeviction")
    reopened = caches(server.url, signing_key=KEY, node="right")
    assert reopened.key_proof is KeyProof.OK
    assert rclient.get(layout.KEY_PROOF_KEY) == key_proof(KEY)


def test_volatile_lru_never_evicts_the_proof(server, rclient, caches, cluster):
    client = server.client()
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory-policy", "volatile-lru")
    client.config_set("maxmemory", str(used + (4 << 20)))
    try:
        for i in range(4_000):  # 16 MiB of expiring keys through a 4 MiB margin
            client.set(f"filler:{i}", b"x" * 4096, ex=3600)
        assert int(client.info("stats")["evicted_keys"]) > 0
        assert client.get(layout.KEY_PROOF_KEY) == key_proof(KEY)
    finally:
        client.config_set("maxmemory", "0")
        client.config_set("maxmemory-policy", "noeviction")


def test_a_proof_of_another_key_is_an_alarm_not_an_authority(server, rclient, caches,
                                                             cluster, tmp_path):
    rclient.set(layout.KEY_PROOF_KEY, key_proof(WRONG))  # a misconfigured node, or planted
    name = NAMES[0]
    rclient.set(layout.manifest_key(cluster, name), b"not json")
    before = entries_state(rclient)
    counts, counters, built = warms(caches, server.url, tmp_path / "b", KEY, "right")
    assert built == [name] and counts["remote_hits"] == len(NAMES) - 1
    assert "quarantined" not in counters and "published" not in counters
    assert entries_state(rclient) == before  # never overwritten: an operator's call
    stats = json.loads(_cli("cache", "stats", "--json", "--redis", server.url,
                            env={"WARMD_SIGNING_KEY": KEY.decode()}).output)
    assert stats["key_proof"]["state"] == "foreign"
    assert stats["key_proof"]["this_node"] == key_proof(KEY).decode()
    text = _cli("cache", "stats", "--redis", server.url,
                env={"WARMD_SIGNING_KEY": KEY.decode()}).output
    assert "Key proof: FOREIGN" in text
    # the operator sets the proof `warmd cache stats` printed: healing resumes
    rclient.set(layout.KEY_PROOF_KEY, stats["key_proof"]["this_node"])
    counts, counters, built = warms(caches, server.url, tmp_path / "c", KEY, "healer")
    assert counters["quarantined"] == 1 and built == [name]
    counts, _counters, built = warms(caches, server.url, tmp_path / "d", KEY, "after")
    assert counts["remote_hits"] == len(NAMES) and built == []


@pytest.mark.parametrize("proof", ["foreign", "keyless"])
def test_kernels_built_without_the_clusters_key_are_never_published(proof, server, rclient,
                                                                    caches, cluster, tmp_path):
    """Each kernel is published as soon as it is built (no task record yet): a node whose
    key is not the cluster's (or that has none in a signed cluster) builds a plan nobody
    published, and writes none of it, counting what it held back."""
    names = ["kernel.q0_0.00000000", "kernel.q0_1.00000001"]
    fresh = {"testlib/unpublished/0": names}
    before = entries_state(rclient)
    key = WRONG if proof == "foreign" else None
    cache = caches(server.url, signing_key=key, node=proof)
    counts = warm(cache, DirAdapter(tmp_path / proof), fresh)
    assert counts["compiled"] == len(names)
    assert "published" not in cache.stats.counters
    assert cache.stats.counters["publish_blocked"] == len(names) + 1  # its kernels, its record
    assert entries_state(rclient) == before


@pytest.mark.parametrize("planted", ["garbage", "wrong-type"])
def test_a_value_that_is_no_proof_is_replaced_by_the_clusters_key(planted, server, rclient,
                                                                  caches, cluster):
    rclient.delete(layout.KEY_PROOF_KEY)
    if planted == "garbage":
        rclient.set(layout.KEY_PROOF_KEY, b"mallory was here")
    else:
        rclient.hset(layout.KEY_PROOF_KEY, "x", "y")
    assert caches(server.url, signing_key=WRONG).key_proof is KeyProof.MISSING
    assert rclient.type(layout.KEY_PROOF_KEY) != b"none"  # the wrong key claimed nothing
    assert caches(server.url, signing_key=KEY).key_proof is KeyProof.OK
    assert rclient.get(layout.KEY_PROOF_KEY) == key_proof(KEY)


def test_a_node_without_a_key_never_heals_a_signed_cluster(server, rclient, caches, cluster,
                                                           tmp_path):
    entry = NAMES[0]
    man = Manifest.decode(rclient.get(layout.manifest_key(cluster, entry)), 1 << 30)
    rclient.setrange(layout.blob_key(man.digest, 0), 0, b"XX")  # a damaged chunk
    before = entries_state(rclient)
    keyless = caches(server.url, node="keyless")
    assert keyless.key_proof is KeyProof.KEYLESS
    task = next(t for t, names in PLAN.items() if entry in names)
    assert keyless.entries.fetch_task(DirAdapter(tmp_path / "k"), task) is None
    assert keyless.stats.counters["corrupt_rejected"] == 1
    assert "quarantined" not in keyless.stats.counters
    adapter = DirAdapter(tmp_path / "k2")
    publication = keyless.entries.publish_task(adapter, task, [compile_entry(adapter, entry)], 1.0)
    assert publication.skipped == "key proof keyless"
    assert entries_state(rclient) == before
    keyed = caches(server.url, signing_key=KEY, node="keyed")
    assert keyed.entries.fetch_task(DirAdapter(tmp_path / "r"), task) is None
    assert keyed.stats.counters["quarantined"] == 1


def test_the_first_keyed_node_of_a_new_store_writes_the_proof(server, rclient, caches,
                                                              tmp_path):
    assert caches(server.url).key_proof is KeyProof.UNSIGNED
    assert caches(server.url, signing_key=KEY).key_proof is KeyProof.OK
    assert rclient.get(layout.KEY_PROOF_KEY) == key_proof(KEY)
    assert rclient.ttl(layout.KEY_PROOF_KEY) == -1
    assert caches(server.url, signing_key=WRONG).key_proof is KeyProof.FOREIGN


def _cli(*args: str, env: dict | None = None):
    result = CliRunner().invoke(main, list(args), env=env)
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    return result


def test_warmd_status_raises_the_alarm_of_a_missing_or_foreign_proof(server, rclient,
                                                                     cluster, tmp_path):
    """Without Ray, status reads the node records and the key proof from Redis."""
    from tests.cluster_support import private_machine, warmd

    with private_machine(tmp_path / "home") as env:
        env = {**env, "WARMD_SIGNING_KEY": KEY.decode()}
        args = ("status", "--redis", server.url, "--namespace", "proof")
        assert json.loads(warmd(env, *args, "--json").stdout)["key_proof"]["state"] == "ok"
        assert "Key proof" not in warmd(env, *args).stdout
        for planted, state in ((None, "missing"), (key_proof(WRONG), "foreign")):
            rclient.delete(layout.KEY_PROOF_KEY)
            if planted:
                rclient.set(layout.KEY_PROOF_KEY, planted)
            shown = json.loads(warmd(env, *args, "--json").stdout)["key_proof"]
            assert shown["state"] == state and shown["alarm"] is True
            assert f"Key proof: {state.upper()}" in warmd(env, *args).stdout
        assert rclient.get(layout.KEY_PROOF_KEY) == key_proof(WRONG)  # status changes nothing
