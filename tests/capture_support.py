"""What the re-derivation tests of the capture share: their plan and signing key, a node's
capture scope under a base directory, a node's store opener, every value a store holds, and
their process isolated as a capture test's (store_support.isolate_capture) with the
producer's Triton allow-list."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from store_support import isolate_capture

from warmd.capture.scope import CaptureScope
from warmd.store import ServerProcess, open_shared_cache
from warmd.targets import preset

PLAN = "plan-rederive-0123456789abcdef"
KEY = b"cluster-key"


def isolate_rederive(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                     server: ServerProcess) -> None:
    isolate_capture(monkeypatch, tmp_path, server)
    # the producer looks Triton kernels up only in the library stand-in's module
    monkeypatch.setenv("WARMD_TRITON_MODULES", "tests.triton_kernels")


def scope(base: Path) -> CaptureScope:
    return CaptureScope(PLAN, preset("h200").to_json(),
                        {"triton": str(base / "triton"), "flashinfer": str(base / "fi"),
                         "flashinfer_autotune": str(base / "vllm")})


def opener(server: ServerProcess, node: str) -> Callable:
    return lambda target: open_shared_cache(server.url, target=target, node=node,
                                            signing_key=KEY)


def published_values(server: ServerProcess) -> list[bytes]:
    """Every value under the store's keys, dumped."""
    client = server.client()
    return [client.dump(k) or b"" for k in client.scan_iter(match="warmd:*")]
