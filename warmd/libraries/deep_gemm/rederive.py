"""Re-deriving a captured DeepGEMM kernel: its ``kernel.cu`` generated again by this node's
DeepGEMM from the kernel's parameters, and compiled with the command this node's DeepGEMM
uses (recorded through ``nvcc_shim`` by ``record_flags``).

DeepGEMM generates a kernel's source in C++ (``csrc/jit_kernels/impls/*.hpp``), one fmt
template per kernel, compiled into its extension (``_C.so`` in sgl-deep-gemm 0.1.4.post1,
``_C_extension.abi3.so`` in DeepGEMM 2.8.1 as vLLM 0.34.0 vendors it):

    #include <deep_gemm/impls/sm90_fp8_gemm_1d2d.cuh>
    <blank>
    using namespace deep_gemm;
    <blank>
    static void __instantiate_kernel() {{
        auto ptr = reinterpret_cast<void*>(&sm90_fp8_gemm_1d2d_impl<
            {}, {}, ...
        >);
    }};

``library_templates`` reads those templates from the installed extension's bytes (never
loading it). A capture contributes only the parameters: its entry name (the kernel's name,
which must be one the library's extension holds) and the template arguments, each a
literal (a number, true/false, a qualified name, a name with literal template arguments)
read by matching the capture's ``kernel.cu`` against the library's template for its kernel
(whitespace and ``//`` comment lines aside). The source compiled is the library's template
filled with them; its includes must resolve inside the library's include tree
(``confine_sources``). A kernel.cu that fits no template of the library, or an argument that
is not a literal, is quarantined (``RederiveMismatch``). nvcc runs in a private scratch
directory, in a process with a reduced environment (sandboxed where bubblewrap can),
reading ``kernel.cu`` by a relative path with ``-frandom-seed=<job key>`` as the warmup's
shim does, so the cubin is the bytes a builder makes.

The re-derived entry is the regenerated ``kernel.cu`` and this node's cubin (a 2.8 entry
also its ``.committed`` marker; the capture's ``meta.json`` is not kept). Not re-derived: the
key's digest (DeepGEMM's C++ takes it over its version, nvcc's, the flags and the source).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from pathlib import Path

from warmd import settings
from warmd.cache.base import UnsafeArtifact
from warmd.cache.install import unpack_safely
from warmd.cache.packing import pack_directory
from warmd.cache.rederived import (
    CannotRederiveHere,
    Rederived,
    RederiveMismatch,
    RederiveRefused,
    confine_sources,
    run_rebuild,
)
from warmd.context import NodeContext
from warmd.libraries.deep_gemm import install
from warmd.libraries.deep_gemm.cache import (
    COMMITTED,
    MAX_SOURCE_BYTES,
    DeepGemmCacheAdapter,
    layout_of,
    parse_kernel_source,
)
from warmd.libraries.deep_gemm.install import Generation
from warmd.libraries.deep_gemm.nvcc_shim import OUTPUT, SOURCE, job_key

# One of DeepGEMM's generated-source templates, as a C string in its extension.
_TEMPLATE = re.compile(rb"#include <deep_gemm/[^\x00]{0,4000}?using namespace deep_gemm;"
                       rb"[^\x00]{0,4000}?__instantiate_kernel\(\) \{\{[^\x00]{0,4000}?"
                       rb"\n\}\};\n?")
# What one template argument may be: a literal, never code.
_NAME = r"[A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)*"
_NUMBER = r"-?\d+(?:\.\d+)?[uUlLfF]{0,3}"
_LITERAL = rf"(?:{_NUMBER}|{_NAME})"
_PARAM = rf"({_NUMBER}|{_NAME}(?:<\s*{_LITERAL}(?:\s*,\s*{_LITERAL})*\s*>)?)"
_MAX_EXTENSION_BYTES = 1 << 30


def flags_file(generation: Generation, fingerprint: str) -> Path:
    return settings.state_dir() / "rederive" / f"deep_gemm-{generation.value}-{fingerprint}.json"


def record_flags(template: list[str], generation: Generation, fingerprint: str) -> Path:
    """Keep the argument template this node's DeepGEMM gave its compiler (a job's
    ``args.json``, recorded through the nvcc shim) for re-deriving captures."""
    if template.count(SOURCE) != 1 or template.count(OUTPUT) != 1:
        raise ValueError("an nvcc argument template names {source} and {output} once each")
    path = flags_file(generation, fingerprint)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(template))
    return path


@functools.cache
def _extension_bytes(location: Path) -> bytes:
    """The bytes of the package's compiled extensions (``*.so`` beside its __init__.py)."""
    parts = []
    for path in sorted(location.glob("*.so")):
        if path.is_file() and path.stat().st_size <= _MAX_EXTENSION_BYTES:
            parts.append(path.read_bytes())
    if not parts:
        raise CannotRederiveHere(f"no DeepGEMM extension in {location}: nothing to generate "
                                 "kernel sources with")
    return b"\0".join(parts)


def library_templates(location: Path) -> dict[str, list[str]]:
    """The kernel-source templates of the DeepGEMM at location, by kernel template name."""
    out: dict[str, list[str]] = {}
    for raw in _TEMPLATE.findall(_extension_bytes(location)):
        text = raw.decode(errors="replace")
        impl = re.search(r"&\s*([A-Za-z_][A-Za-z0-9_:]*)\s*<", text)
        if impl is not None:
            out.setdefault(impl.group(1), []).append(text)
    return out


def _fmt_parts(template: str) -> list[str]:
    """The literal text around each ``{}`` of an fmt template, escapes undone."""
    return [part.replace("{{", "{").replace("}}", "}") for part in
            re.split(r"(?<!\{)\{\}(?!\})", template)]


def _pattern(template: str) -> re.Pattern:
    """A capture's kernel.cu made from this template: its literal text (any whitespace where
    it has some, optional ``//`` comment lines first), a literal for each ``{}``."""
    def literal(text: str) -> str:
        return r"\s*".join(re.escape(w) for w in re.split(r"\s+", text))

    body = _PARAM.join(literal(part) for part in _fmt_parts(template))
    return re.compile(r"\s*(?://[^\n]*\n\s*)*" + body + r"\s*", re.S)


def regenerate(location: Path, name: str, captured: str) -> str:
    """The kernel.cu this node's DeepGEMM generates for the capture's kernel and template
    arguments; RederiveMismatch when the capture fits no template of the library."""
    parsed = parse_kernel_source(captured)
    if parsed is None:
        raise RederiveMismatch("kernel.cu instantiates no DeepGEMM kernel")
    kernel = name.split(".")[-2]
    if not re.fullmatch(r"[A-Za-z0-9_]+", kernel) or \
            re.search(rb"(?<![A-Za-z0-9_])" + kernel.encode() + rb"(?![A-Za-z0-9_])",
                      _extension_bytes(location)) is None:
        raise RederiveMismatch(f"this node's DeepGEMM has no kernel named {kernel}")
    for template in library_templates(location).get(parsed.impl, []):
        found = _pattern(template).fullmatch(captured)
        if found is not None:
            parts = _fmt_parts(template)
            return "".join(p + (found.group(i + 1) if i < len(parts) - 1 else "")
                           for i, p in enumerate(parts))
    raise RederiveMismatch(f"kernel.cu is not what this node's DeepGEMM generates for "
                           f"{parsed.impl} (another form, another include or code of its "
                           "own)")


def rederive(adapter: DeepGemmCacheAdapter, name: str, artifact: bytes, scratch: Path,
             template: list[str] | None = None, library: Path | None = None,
             context: NodeContext | None = None) -> Rederived:
    """``context``: the producer's (default: this process's environment)."""
    context = context or NodeContext.of()
    layout = layout_of(name)
    if layout is None:
        raise RederiveRefused(f"not a DeepGEMM cache entry name: {name!r}")
    location = library or _library(layout.generation)
    capture = scratch / "capture" / name
    unpack_safely(artifact, capture)
    try:
        captured = (capture / "kernel.cu").read_bytes()
    except FileNotFoundError:
        raise RederiveRefused("the entry has no kernel.cu to rebuild from") from None
    if len(captured) > MAX_SOURCE_BYTES:
        raise RederiveRefused("kernel.cu is larger than any DeepGEMM generates")
    source = regenerate(location, name, captured.decode(errors="replace")).encode()
    template = template or _recorded(adapter, layout.generation)
    run = scratch / "run"  # private: the scratch is a fresh 0700 directory
    run.mkdir()
    (run / "kernel.cu").write_bytes(source)
    confine_sources([run / "kernel.cu"], [location / "include", run])
    nvcc = str(settings.cuda_home() / "bin" / "nvcc")
    run_rebuild([nvcc, *("kernel.cu" if a == SOURCE else "kernel.cubin" if a == OUTPUT
                         else a for a in template),
                 f"-frandom-seed={job_key(template, source)}"],
                env={**os.environ, **context.child_env()}, cwd=str(run))
    cubin = (run / "kernel.cubin").read_bytes()
    entry = scratch / "entry" / name
    entry.mkdir(parents=True)
    (entry / "kernel.cu").write_bytes(source)
    (entry / "kernel.cubin").write_bytes(cubin)
    if COMMITTED in layout.required:
        (entry / COMMITTED).write_bytes(b"")
    packed = pack_directory(entry)
    differs = tuple(f for f, ours in (("kernel.cu", source), ("kernel.cubin", cubin))
                    if not (capture / f).is_file() or (capture / f).read_bytes() != ours)
    return Rederived(packed, packed == artifact, differs)


def _library(generation: Generation) -> Path:
    """The package directory of the DeepGEMM installed here, when it is of generation."""
    found = install.resolve()
    if found is None or found.generation is not generation:
        raise CannotRederiveHere(f"no DeepGEMM of the {generation.value} generation is "
                                 "installed here")
    return found.location


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
