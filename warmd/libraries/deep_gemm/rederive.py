"""Re-deriving a captured DeepGEMM kernel: its ``kernel.cu`` compiled again by this node's
nvcc with the command this node's DeepGEMM uses (``nvcc_shim``'s job: the source and the
argument template DeepGEMM gave the shim, recorded on this node by ``record_flags``).

The source must be DeepGEMM's generated form (comments, ``#include <deep_gemm/...>``,
``using namespace deep_gemm;`` and one template instantiation of a DeepGEMM kernel), so
what is compiled is one of DeepGEMM's own kernels; the flags are never the claim's. The
re-derived entry is the claim's ``kernel.cu`` and this node's cubin (a 2.8 entry also its
``.committed`` marker; the claim's ``meta.json`` is not kept). Not re-derived: the key
(the entry's name), a digest DeepGEMM's C++ takes over its version, nvcc's, the flags and
the source: which template arguments a name stands for is the capturing node's word.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from warmd import settings
from warmd.cache.artifacts import pack_directory, unpack_safely
from warmd.cache.base import UnsafeArtifact
from warmd.cache.rederived import CannotRederiveHere, Rederived, RederiveRefused
from warmd.libraries.deep_gemm.cache import (
    COMMITTED,
    MAX_SOURCE_BYTES,
    DeepGemmCacheAdapter,
    layout_of,
    parse_kernel_source,
)
from warmd.libraries.deep_gemm.install import Generation
from warmd.libraries.deep_gemm.nvcc_shim import OUTPUT, SOURCE, compile_job, save_job

_LINE = re.compile(r"^\s*(//.*)?$|^#include <deep_gemm/[A-Za-z0-9_/.]+\.cuh?>\s*$"
                   r"|^using namespace deep_gemm;\s*$")
_ARG = re.compile(r"^[A-Za-z0-9_:.,<>() +\-*/]*$")


def flags_file(generation: Generation, fingerprint: str) -> Path:
    return settings.state_dir() / "rederive" / f"deep_gemm-{generation.value}-{fingerprint}.json"


def record_flags(template: list[str], generation: Generation, fingerprint: str) -> Path:
    """Keep the argument template this node's DeepGEMM gave its compiler (a job's
    ``args.json``, recorded through the nvcc shim) for re-deriving claims."""
    if template.count(SOURCE) != 1 or template.count(OUTPUT) != 1:
        raise ValueError("an nvcc argument template names {source} and {output} once each")
    path = flags_file(generation, fingerprint)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(template))
    return path


def check_source(text: str) -> None:
    """RederiveRefused unless text is a kernel.cu of DeepGEMM's generated form."""
    if parse_kernel_source(text) is None:
        raise RederiveRefused("kernel.cu instantiates no DeepGEMM kernel")
    body = text[:text.index("static void __instantiate_kernel()")]
    if not all(_LINE.match(line) for line in body.splitlines()):
        raise RederiveRefused("kernel.cu holds code beyond DeepGEMM's includes")
    tail = text[text.index("static void __instantiate_kernel()"):]
    match = re.fullmatch(r"static void __instantiate_kernel\(\) \{\s*auto ptr = "
                         r"reinterpret_cast<void\*>\(&\s*([A-Za-z_][A-Za-z0-9_:]*)\s*<(.*)>"
                         r"\s*\);\s*\};?\s*", tail, re.S)
    if match is None or not _ARG.match(match.group(2).replace("\n", " ")):
        raise RederiveRefused("kernel.cu's instantiation is not DeepGEMM's generated form")


def rederive(adapter: DeepGemmCacheAdapter, name: str, artifact: bytes, scratch: Path,
             template: list[str] | None = None) -> Rederived:
    layout = layout_of(name)
    if layout is None:
        raise RederiveRefused(f"not a DeepGEMM cache entry name: {name!r}")
    claim = scratch / "claim" / name
    unpack_safely(artifact, claim)
    try:
        source = (claim / "kernel.cu").read_bytes()
    except FileNotFoundError:
        raise RederiveRefused("the entry has no kernel.cu to rebuild from") from None
    if len(source) > MAX_SOURCE_BYTES:
        raise RederiveRefused("kernel.cu is larger than any DeepGEMM generates")
    check_source(source.decode(errors="replace"))
    template = template or _recorded(adapter, layout.generation)
    nvcc = str(settings.cuda_home() / "bin" / "nvcc")
    run = scratch / "run"
    job = save_job(run, template, source)
    failure = compile_job(run, job, nvcc)
    if failure is not None:
        raise RederiveRefused("nvcc failed on the recorded kernel.cu")
    entry = scratch / "entry" / name
    entry.mkdir(parents=True)
    (entry / "kernel.cu").write_bytes(source)
    (entry / "kernel.cubin").write_bytes(job.cubin.read_bytes())
    if COMMITTED in layout.required:
        (entry / COMMITTED).write_bytes(b"")
    packed = pack_directory(entry)
    differs = () if (claim / "kernel.cubin").is_file() and \
        (claim / "kernel.cubin").read_bytes() == job.cubin.read_bytes() else ("kernel.cubin",)
    return Rederived(packed, packed == artifact, differs)


def _recorded(adapter: DeepGemmCacheAdapter, generation: Generation) -> list[str]:
    path = flags_file(generation, adapter_digest(adapter))
    try:
        template = json.loads(path.read_text())
    except (OSError, ValueError):
        raise CannotRederiveHere("no DeepGEMM compile command recorded on this node (see "
                                 "warmd.libraries.deep_gemm.rederive.record_flags)") from None
    if not isinstance(template, list) or not all(isinstance(a, str) for a in template):
        raise UnsafeArtifact(f"{path} is not an argument list")
    return template


def adapter_digest(adapter: DeepGemmCacheAdapter) -> str:
    """The key record_flags files a template under for this adapter's DeepGEMM."""
    return hashlib.sha256(json.dumps(adapter.fingerprint_inputs(), sort_keys=True,
                                     default=str).encode()).hexdigest()[:16]
