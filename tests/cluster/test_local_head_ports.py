"""`warmd start`'s local Ray head on a busy machine: a port another process takes between
warmd's probe and Ray's bind is picked again. A real Ray head, one port held; in a serial
Ray group (cluster_support.RAY_CLUSTER_GROUPS), so that no third Ray cluster runs beside the
suite's two. Most of its time is Ray's own wait (about 40 s) before giving up on the taken
port."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")

pytestmark = pytest.mark.slow


def test_a_port_taken_before_ray_binds_it_is_picked_again(tmp_path, monkeypatch):
    """On a busy machine another process can take a port between warmd's probe and Ray's
    bind (Ray's GCS then exits: 'Failed to start the grpc server'): the head is started
    again on fresh ports instead of failing `warmd start`."""
    import socket

    from warmd import store
    from warmd.cluster.local_head import start_local_head, stop_local_services

    monkeypatch.setenv("WARMD_STATE_DIR", str(tmp_path / "state"))
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    picks, real = iter([port]), store.free_port
    monkeypatch.setattr(store, "free_port", lambda: next(picks, None) or real())
    try:
        address, _warnings = start_local_head()
        assert address.startswith("127.0.0.1:") and not address.endswith(f":{port}")
    finally:
        stop_local_services()
        taken.close()
