"""Chunk reads are bounded by the manifests' declared sizes. A process
fetching entries whose chunks an attacker grew to hundreds of MB keeps its peak RSS within a
fixed margin of where it started (measured in a separate process, with a real server)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from store_support import SRC, DirAdapter, module_server, task_entries, warm

from warmd.store import layout
from warmd.store.formats import Manifest

BIG = 150 << 20  # what each poisoned chunk holds: more than twice the 64 MiB batch limit
MARGIN = 48 << 20  # generous: the declared sizes are 2 x 120 kB

# Runs in a child: open the cache, note peak RSS, fetch the task, note peak RSS again.
CHILD = """
import json, resource, sys
sys.path.insert(0, sys.argv[2])
from store_support import DirAdapter
from warmd.store import open_shared_cache
args = json.loads(sys.argv[1])
cache = open_shared_cache(args["url"], node="victim")
adapter = DirAdapter(args["root"])
cache.fingerprint(adapter)
cache.ping()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
got = cache.entries.fetch_task(adapter, args["task"])
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"got": got, "before": before, "after": after, "counters": cache.stats.counters}))
cache.close()
"""


server = module_server()


def _fetch_in_child(url: str, root: Path, task: str) -> dict:
    args = json.dumps({"url": url, "root": str(root), "task": task})
    done = subprocess.run([sys.executable, "-c", CHILD, args, str(Path(__file__).parents[1])],
                          capture_output=True, text=True, timeout=300, cwd=SRC)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("where", ["first", "last"])
def test_oversized_chunks_are_refused_without_being_read(where, server, rclient, caches,
                                                         tmp_path):
    plan = task_entries(1, per_task=2)
    (task, names), = plan.items()
    writer = caches(server.url, node="writer")
    adapter = DirAdapter(tmp_path / "a")
    warm(writer, adapter, plan, size=3 << 20)  # three chunks per entry (incompressible)
    fp = writer.fingerprint(adapter).digest
    planter = server.client(timeout=120)  # the attacker's 150 MiB writes: no 1 s bound
    for name in names:
        man = Manifest.decode(rclient.get(layout.manifest_key(fp, name)), 1 << 30)
        index = 0 if where == "first" else man.chunks - 1
        planter.set(layout.blob_key(man.digest, index), b"x" * BIG)
    planter.close()
    result = _fetch_in_child(server.url, tmp_path / "b", task)
    assert result["got"] is None
    assert result["counters"]["corrupt_rejected"] == 2
    assert result["counters"]["quarantined"] == 2
    grown = result["after"] - result["before"]
    print(f"peak RSS grew {grown / 2**20:.1f} MiB fetching 2 x {BIG >> 20} MiB chunks")
    assert grown < MARGIN, f"peak RSS grew {grown / 2**20:.1f} MiB"
    assert not (tmp_path / "b").exists() or DirAdapter(tmp_path / "b").list_entries() == []
    # the next publish rewrites the chunks: every later node installs the entries
    assert warm(caches(server.url, node="healer"), DirAdapter(tmp_path / "c"), plan,
                size=3 << 20)["compiled"] == 2
    assert caches(server.url, node="late").entries.fetch_task(
        DirAdapter(tmp_path / "d"), task) == names
    assert rclient.strlen(layout.blob_key(man.digest, index)) <= 1 << 20
