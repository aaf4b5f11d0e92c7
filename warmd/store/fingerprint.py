"""The compatibility fingerprint: everything that decides whether a shared entry can hit here.

It starts from what the library's adapter says its cache key depends on (version, install
path, torch...: ``warmd.cache.records.adapter_inputs``, the inputs this node's own task
records are fingerprinted by) and adds what sharing between nodes depends on: the target GPU
(arch with suffix, SM count), the CUDA toolkit and the CUDA major version the driver serves
(a build from toolkit X runs on drivers of major X; a builder without a GPU assumes its
toolkit's major), and the operator's namespace salt. Where both name a field the adapter's
value wins unless it is None (unknown to the adapter). Entries live under their fingerprint's
digest, so a node only ever sees entries that can hit.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from warmd import settings
from warmd.cache.base import CacheAdapter
from warmd.cache.records import adapter_inputs
from warmd.targets import Target

SCHEMA = 1

# The inputs every library's fingerprint shares: (why, what to change when two nodes differ).
COMMON_INPUTS = {
    "schema": ("warmd's layout of shared entries", "run the same warmd version"),
    "library": ("entries are per library", "-"),
    "namespace": ("the operator's salt (redis.namespace, WARMD_NAMESPACE)",
                  "use the same namespace on both nodes"),
    "cuda_toolkit": ("the CUDA toolkit that built the entry (nvcc --version)",
                     "install the same CUDA toolkit version"),
    "arch": ("the target GPU's architecture", "warm for the same GPU (--target)"),
    "sms": ("the target GPU's SM count (kernels are tuned per SM count)",
            "warm for the same GPU model (--target, --sms)"),
    "driver_cuda_major": ("the CUDA major version the driver serves",
                          "use drivers of the same CUDA major version"),
}
DIGEST_HEX = 24  # 96 bits: collisions are not a practical concern at cluster scale


@dataclass(frozen=True)
class Fingerprint:
    library: str
    inputs: dict  # exactly what the digest covers
    digest: str

    def to_json(self) -> dict:
        return {"library": self.library, "digest": self.digest, "inputs": self.inputs}


def _major(version: str | None) -> str | None:
    return version.split(".")[0] if version else None


def target_inputs(target: Target | None, toolkit: str | None) -> dict:
    if target is None:
        return {"driver_cuda_major": _major(toolkit)}
    return {"arch": target.arch, "sms": target.sms,
            "driver_cuda_major": _major(target.cuda) or _major(toolkit)}


def fingerprint_of(library: str, adapter_inputs: dict, target: Target | None = None,
                   namespace: str | None = None, toolkit: str | None = None) -> Fingerprint:
    """The fingerprint for explicit inputs (what compute_fingerprint gathers from the node)."""
    inputs: dict = {"schema": SCHEMA, "library": library,
                    "namespace": settings.namespace() if namespace is None else namespace,
                    "cuda_toolkit": toolkit}
    inputs.update(target_inputs(target, toolkit))
    inputs.update({k: v for k, v in adapter_inputs.items() if v is not None})
    inputs = {k: v for k, v in inputs.items() if v is not None}
    inputs["library"] = library  # an adapter cannot claim another library's entries
    inputs = json.loads(json.dumps(inputs, default=str))  # exactly what is stored and shown
    return Fingerprint(library, inputs, digest_of(inputs))


def discovery_digest(fp: Fingerprint) -> str:
    """Where what a discovery learnt (kernel lists) lives: the fingerprint without the
    namespace salt, so a cold boot in another namespace reads it too. The kernels a
    library picks depend on its build and the GPU, never on the operator's salt; a list
    names kernels, and each still compiles (or installs) under its namespace's key."""
    inputs = {k: v for k, v in fp.inputs.items() if k != "namespace"}
    return digest_of({**inputs, "scope": "discovery"})


def digest_of(inputs: dict) -> str:
    """The fingerprint digest of a set of inputs."""
    blob = json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:DIGEST_HEX]


def compute_fingerprint(adapter: CacheAdapter, target: Target | None = None,
                        namespace: str | None = None) -> Fingerprint:
    """This node's fingerprint for one library's cache (namespace: the node's salt;
    default: WARMD_NAMESPACE of this process's environment)."""
    from warmd.libraries import probe_library  # the registry loads every library's kernels

    toolkit = probe_library("nvcc").version
    return fingerprint_of(adapter.library, adapter_inputs(adapter), target, namespace, toolkit)
