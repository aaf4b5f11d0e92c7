"""Re-deriving a captured FlashInfer module: its sources built again by this node's
FlashInfer, with a build.ninja FlashInfer itself writes.

The claim's ``build.ninja`` is read only for what FlashInfer's generator takes as input
(``flashinfer.jit.cpp_ext.generate_ninja_build_for_op``): the module's name, its sources
and the flags beyond FlashInfer's defaults. Every source must be one of the claim's
generated sources (brought by the artifact) or a file of this node's FlashInfer package;
every extra flag one of the forms FlashInfer's modules pass (``-D`` macros, gencode, a few
literal switches, include directories inside FlashInfer's package). FlashInfer then writes
the build file under a scratch workspace, and it must be the claim's file with only the
workspace changed: anything else (another compiler, a launcher, a flag or a rule the
generator does not write) is refused, and ninja never runs on the captured file. ninja
then builds the module there, in a process of its own, and the module is packed the way
any warmed module is (installs relocate it).

Identical means the built code (the module's ``.so`` and objects) is byte for byte the
claim's; ninja's logs and the build file name the scratch workspace, so the artifact
itself always differs, and the rebuilt one is what is published.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

from warmd.cache.artifacts import unpack_safely
from warmd.cache.base import CacheEntry
from warmd.cache.rederived import (
    CannotRederiveHere,
    Rederived,
    RederiveRefused,
    run_rebuild,
)
from warmd.libraries.flashinfer.cache import (
    FlashInferCacheAdapter,
    _check_layout,
    _check_module_name,
    _workspace_of,
)

_MACRO = re.compile(r"^-D[A-Za-z_][A-Za-z0-9_]*(=[A-Za-z0-9_.+-]{1,64})?$")
_GENCODE = re.compile(r"^-gencode=arch=compute_\d{2,3}[af]?,code=(sm|compute)_\d{2,3}[af]?$")
_LITERAL = {"-O0", "-O1", "-O2", "-O3", "-use_fast_math", "--use_fast_math", "-lineinfo",
            "-std=c++17", "-std=c++20", "--expt-relaxed-constexpr", "--expt-extended-lambda",
            "-fPIC", "-DNDEBUG", "-Xfatbin=-compress-all", "--compress-mode=size",
            "-static-global-template-stub=false", "--compiler-options=-fPIC",
            "-Wno-switch-bool", "-lcuda", "-lcudart", "-lcublas", "-lcublasLt", "-lnvrtc"}
_THREADS = re.compile(r"^--threads=\d{1,2}$")


def allowed_flag(flag: str, include_roots: tuple[str, ...]) -> bool:
    """Whether a flag beyond FlashInfer's defaults is one its modules pass."""
    if flag in _LITERAL or _MACRO.match(flag) or _GENCODE.match(flag) or _THREADS.match(flag):
        return True
    if flag.startswith("-I"):
        path = os.path.realpath(flag[2:])
        return any(path == root or path.startswith(root + "/") for root in include_roots)
    return False


def rederive(adapter: FlashInferCacheAdapter, name: str, artifact: bytes,
             scratch: Path) -> Rederived:
    _check_module_name(name)
    claim = scratch / "claim"
    unpack_safely(artifact, claim)
    module = _check_layout(claim, name)
    old_ws = _workspace_of(module, name)
    ws_base = scratch / "ws"
    arch_list = _arch_list(adapter.arch)
    ours = FlashInferCacheAdapter(ws_base, arch_list, adapter.version)
    ours.workspace_dir.mkdir(parents=True)
    new_ws = str(ours.workspace_dir.resolve())
    if (claim / "generated").is_dir():
        for src in sorted(p for p in (claim / "generated").rglob("*") if p.is_file()):
            dest = ours.generated_dir / src.relative_to(claim / "generated")
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(src.read_bytes())
    job = {"name": name, "old_ws": old_ws, "new_ws": new_ws,
           "build_ninja": (module / "build.ninja").read_text(errors="replace")}
    (scratch / "job.json").write_text(json.dumps(job))
    from warmd.libraries.flashinfer.executor import worker_env

    env = {**os.environ, **worker_env(arch_list, ws_base),
           "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    for knob in ("FLASHINFER_EXTRA_CFLAGS", "FLASHINFER_EXTRA_CUDAFLAGS",
                 "FLASHINFER_EXTRA_LDFLAGS", "FLASHINFER_NVCC_LAUNCHER",
                 "FLASHINFER_CXX_LAUNCHER"):
        env.pop(knob, None)  # this node's build, not one a variable reshapes
    run_rebuild([sys.executable, "-m", "warmd.libraries.flashinfer.rederive",
                 str(scratch / "job.json")], env=env, cwd=str(scratch))
    built = ours.root / name
    if not ours.is_complete(name):
        raise RederiveRefused(f"the rebuilt module {name} is not complete")
    differs = tuple(sorted(
        child.name for child in built.iterdir()
        if child.suffix in (".so", ".o") and (not (module / child.name).is_file()
                                              or (module / child.name).read_bytes()
                                              != child.read_bytes())))
    packed = ours.pack(CacheEntry(adapter.library, name, built))
    return Rederived(packed, not differs, differs)


def _arch_list(directory: str) -> str:
    """FlashInfer's arch list from its directory name: '90a' -> '9.0a', '80_90a' ->
    '8.0 9.0a'."""
    items = [re.fullmatch(r"(\d+)(\d)([af]?)", item) for item in directory.split("_")]
    if not all(items):
        raise CannotRederiveHere(f"unknown FlashInfer arch directory {directory!r}")
    return " ".join(f"{m.group(1)}.{m.group(2)}{m.group(3)}" for m in items)


# ----- in the rebuild process (FLASHINFER_WORKSPACE_BASE is the scratch workspace) -----

def _variables(text: str) -> dict[str, list[str]]:
    """build.ninja's top-level variables, continuation lines joined, split in words."""
    joined = re.sub(r" \$\n\s*", " ", text)
    out = {}
    for line in joined.splitlines():
        found = re.match(r"^([A-Za-z_]+) = ?(.*)$", line)
        if found:
            out[found.group(1)] = _words(found.group(2))
    return out


def _words(value: str) -> list[str]:
    """Flags as FlashInfer joins them: "-isystem DIR" stays one flag."""
    words, out = value.split(), []
    for word in words:
        if out and out[-1] == "-isystem":
            out[-1] = f"-isystem {word}"
        else:
            out.append(word)
    return out


def _extra(claimed: list[str], defaults: list[str]) -> list[str]:
    """The claimed flags FlashInfer's defaults do not hold, in their order."""
    left = list(defaults)
    extra = []
    for flag in claimed:
        if flag in left:
            left.remove(flag)
        else:
            extra.append(flag)
    return extra


def _rebuild(job: dict) -> None:
    import subprocess

    from flashinfer.jit import cpp_ext
    from flashinfer.jit import env as jit_env

    name, old_ws, new_ws = job["name"], job["old_ws"], job["new_ws"]
    claimed = job["build_ninja"]
    variables = _variables(claimed)
    cuda_home = cpp_ext.get_cuda_path()
    common = cpp_ext.build_common_cflags(cuda_home, None)
    roots = tuple(os.path.realpath(p) for p in (
        Path(cpp_ext.__file__).parents[1], new_ws + "/generated"))
    extra = {
        "cflags": _extra(variables.get("cflags", []), cpp_ext.build_cflags(common, None)),
        "cuda_cflags": _extra(variables.get("cuda_cflags", []),
                              cpp_ext.build_cuda_cflags(common, None)),
        "ldflags": _extra(variables.get("ldflags", []),
                          ["-shared", "-L$cuda_home/lib64", "-L$cuda_home/lib64/stubs",
                           "-lcudart", "-lcuda"]),
        "common": _extra(variables.get("common_cflags", []), common),
    }
    for kind, flags in extra.items():
        bad = [f for f in flags if not allowed_flag(f.replace(old_ws, new_ws), roots)]
        if bad:
            sys.exit(f"refused: {kind} flag {bad[0][:80]!r} is not one FlashInfer passes")
    sources = []
    for found in re.finditer(r"^build \S+: (?:cuda_compile|compile) (\S+)$", claimed,
                             re.MULTILINE):
        path = found.group(1).replace(old_ws + "/", new_ws + "/", 1)
        real = os.path.realpath(path)
        if not any(real.startswith(root + "/") for root in roots) or not os.path.isfile(real):
            sys.exit("refused: a source is neither generated nor FlashInfer's own")
        sources.append(Path(path))
    text = cpp_ext.generate_ninja_build_for_op(
        name, sources, extra["cflags"] or None,
        [f.replace(old_ws, new_ws) for f in extra["cuda_cflags"]] or None,
        extra["ldflags"] or None,
        [Path(f[2:].replace(old_ws, new_ws)) for f in extra["common"]] or None,
        needs_device_linking="rule nvcc_link" in claimed)
    if text.strip() != claimed.replace(old_ws + "/", new_ws + "/").strip():
        sys.exit("refused: build.ninja is not what FlashInfer writes for its sources and flags")
    module = jit_env.FLASHINFER_JIT_DIR / name
    module.mkdir(parents=True, exist_ok=True)
    (module / "build.ninja").write_text(text)
    done = subprocess.run(["ninja", "-C", str(module), "-f", "build.ninja"],
                          capture_output=True, timeout=3600)
    if done.returncode != 0:
        sys.exit(f"the rebuild failed (ninja exit {done.returncode})")


if __name__ == "__main__":
    _rebuild(json.loads(Path(sys.argv[1]).read_text()))
