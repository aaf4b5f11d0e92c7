"""Poisoned store values end to end, with real FlashInfer builds and a real redis-server: a manifest
poisoned with a plain Redis client never fails `warmd warmup` (exit 0, the module compiled
here, the refusal counted in --json), and the next publish heals it for the next node, whose
installed module counts as one hit in the per-fingerprint stats."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from flashinfer_support import FLASHINFER_PLAN_ARGS, flashinfer_plan
from store_support import fp_counts, start_test_server

from warmd.libraries.flashinfer.cache import FlashInferCacheAdapter
from warmd.store import layout, open_shared_cache
from warmd.warmup import WarmupOptions, run_warmup

pytestmark = pytest.mark.slow  # real FlashInfer builds

PLAN_ARGS = [*FLASHINFER_PLAN_ARGS, "--task-filter", "act_and_mul"]


def _options(workspace) -> WarmupOptions:
    return WarmupOptions(libraries=("flashinfer",), cache_roots={"flashinfer": workspace},
                         task_filter="act_and_mul")


def test_poisoned_manifest_degrades_warmup_then_heals(tmp_path, monkeypatch):
    monkeypatch.setenv("WARMD_STATE_DIR", str(tmp_path / "state"))
    server = start_test_server(tmp_path)
    client = server.client()
    try:
        plan = flashinfer_plan()
        node_a = open_shared_cache(server.url, target=plan.env.target, node="a")
        first = run_warmup(plan, _options(tmp_path / "a"), shared=node_a)
        node_a.close()
        assert first.counters.compiled == 1 and first.reports[0].published

        (fp,) = [k.decode().split("{")[1].rstrip("}") for k in
                 client.scan_iter(match=layout.fp_meta_key("*"))]
        (man_key,) = list(client.scan_iter(match=layout.manifest_key(fp, "*")))
        client.set(man_key, client.get(man_key).replace(b'"v":1', b'"v":1e999'))

        env = {**os.environ, "WARMD_STATE_DIR": str(tmp_path / "state-b"),
               "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "b")}
        proc = subprocess.run([sys.executable, "-m", "warmd", "warmup", *PLAN_ARGS,
                               "--redis", server.url, "--json"], capture_output=True,
                              text=True, env=env, timeout=900)
        assert proc.returncode == 0, proc.stderr  # degraded to a local compile, not failed
        data = json.loads(proc.stdout)
        assert data["kernels"]["compiled"] == 1 and data["kernels"]["failed"] == 0
        assert "Traceback" not in proc.stderr
        counters = data["store"]["counters"]
        assert counters["corrupt_rejected"] == 1 and counters["quarantined"] == 1
        assert counters["published"] == 1  # the healing publish

        node_c = open_shared_cache(server.url, target=plan.env.target, node="c")
        third = run_warmup(plan, _options(tmp_path / "c"), shared=node_c)
        node_c.close()  # its counters flushed
        looker = open_shared_cache(server.url, node="looker")
        stats = fp_counts(looker, fp)
        looker.close()
        c = third.counters
        assert (c.remote_hits, c.compiled, c.failed) == (1, 0, 0), third.to_json()
        adapter = FlashInferCacheAdapter(tmp_path / "c", "9.0a")
        assert [e.name for e in adapter.list_entries()] == ["silu_and_mul"]
        assert stats["remote_hits"] == 1 and stats["tasks_hit"] == 1, stats
        assert stats.get("local_hits", 0) == 0, stats  # one installed module: one hit
    finally:
        client.close()
        server.stop()
