"""Re-deriving a captured FlashInfer module from its URI, with this node's FlashInfer.

A module's name is its URI, and FlashInfer's JIT makes it from parameters: ``generator``
below maps each URI warmd's plans can name (kernels.py) to the ``gen_*`` function and
arguments that make it. A process of its own, in a sandbox where bubblewrap can make one
(``warmd.cache.rederived.run_rebuild``), calls that generator with a fresh, private
workspace: FlashInfer writes the sources and its build.ninja there, and builds the module
(``spec.build()``, the way any warmup does; FlashInfer's EXTRA_*FLAGS and launcher variables
are not passed). The generator's spec must be named the capture's URI. Nothing of the capture
is compiled or read as a build input: no source, flag, path or build file.

The capture's recorded generated sources are then compared with the ones FlashInfer wrote (the
workspace path taken out): a capture whose sources differ, or that records sources FlashInfer
did not write, is quarantined (``RederiveMismatch``: dropped, counted, never published).
A URI no generator makes is refused: that module stays local to the node that built it.

Identical means the built code (the module's ``.so`` and objects) is byte for byte the
capture's; ninja's logs and the build file name the scratch workspace, so the artifact
itself always differs, and the rebuilt one is what is published.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

from warmd.cache.base import CacheEntry
from warmd.cache.install import unpack_safely
from warmd.cache.rederived import (
    CannotRederiveHere,
    Rederived,
    RederiveMismatch,
    RederiveRefused,
    confine_sources,
    run_rebuild,
)
from warmd.context import NodeContext
from warmd.libraries.flashinfer.cache import (
    FlashInferCacheAdapter,
    _check_layout,
    _check_module_name,
    workspace_of,
)

_DTYPE = {"bf16": "bfloat16", "f16": "float16", "f32": "float32", "e4m3": "float8_e4m3fn",
          "e5m2": "float8_e5m2", "i32": "int32", "i64": "int64", "u8": "uint8"}
_D = "(" + "|".join(_DTYPE) + ")"
_B = "(True|False)"
_ATTN = (rf"dtype_q_{_D}_dtype_kv_{_D}_dtype_o_{_D}_dtype_idx_{_D}_head_dim_qk_(\d{{2,3}})_"
         rf"head_dim_vo_(\d{{2,3}})_posenc_([0-2])_use_swa_{_B}_use_logits_cap_{_B}")
# URI -> (generator, how its match groups become the generator's arguments)
_FAMILIES: tuple[tuple[re.Pattern, str, object], ...] = (
    (re.compile(r"(silu|gelu|gelu_tanh)_and_mul"), "flashinfer.jit:gen_act_and_mul_module",
     lambda g: [g[0]]),
    (re.compile(f"batch_decode_with_kv_cache_{_ATTN}"),
     "flashinfer.jit:gen_batch_decode_module", lambda g: _attn(g)),
    (re.compile(f"batch_prefill_with_kv_cache_{_ATTN}_f16qk_{_B}(_sm90)?"),
     "flashinfer.jit:gen_batch_prefill_module",
     lambda g: ["fa3" if g[10] else "fa2", *_attn(g[:9]), g[9] == "True"]),
    (re.compile(rf"batch_mla_attention_dtype_q_{_D}_dtype_kv_{_D}_dtype_o_{_D}_dtype_idx_"
                rf"{_D}_head_dim_ckv_(\d{{2,3}})_head_dim_kpe_(\d{{2,3}})_profiler_{_B}"
                r"_planabi2(_sm90)?"),
     "flashinfer.jit:gen_batch_mla_module",
     lambda g: ["fa3" if g[7] else "fa2", *(_DTYPE[d] for d in g[:4]), int(g[4]), int(g[5]),
                g[6] == "True"]),
    (re.compile("sampling"), "flashinfer.jit.sampling:gen_sampling_module", lambda g: []),
    (re.compile("fp8_blockscale_gemm_90"),
     "flashinfer.jit.gemm:gen_fp8_blockscale_gemm_sm90_module", lambda g: []),
    (re.compile("fp8_gemm_cutlass"), "flashinfer.jit.gemm.core:gen_gemm_sm100_module_cutlass_fp8",
     lambda g: []),
    (re.compile("mxfp8_gemm_cutlass(_sm120)?"), "", lambda g: []),
    (re.compile("fused_moe_(90|100|103|120)"), "", lambda g: []),
)  # not the TRT-LLM-gen MoE modules: they link cubins FlashInfer downloads, not sources


def _attn(g) -> list:
    return [*(_DTYPE[d] for d in g[:4]), int(g[4]), int(g[5]), int(g[6]), g[7] == "True",
            g[8] == "True"]


def generator(name: str) -> tuple[str, list] | None:
    """The FlashInfer generator and arguments that make the module named name (its URI), or
    None when warmd knows none."""
    for pattern, gen, args in _FAMILIES:
        found = pattern.fullmatch(name)
        if found is None:
            continue
        if name.startswith("mxfp8_gemm_cutlass"):
            sm = "sm120" if found.group(1) else "sm100"
            gen = f"flashinfer.jit.gemm.core:gen_gemm_{sm}_module_cutlass_mxfp8"
        elif name.startswith("fused_moe_") and not gen:
            gen = f"flashinfer.jit.fused_moe:gen_cutlass_fused_moe_sm{found.group(1)}_module"
        return gen, args(found.groups())
    return None


def rederive(adapter: FlashInferCacheAdapter, name: str, artifact: bytes,
             scratch: Path, context: NodeContext | None = None) -> Rederived:
    """``context``: the producer's (default: this process's environment)."""
    _check_module_name(name)
    made = generator(name)
    if made is None:
        raise RederiveRefused(f"no FlashInfer generator warmd knows makes module {name}: "
                              "it stays local to the node that built it")
    capture = scratch / "capture"
    unpack_safely(artifact, capture)
    module = _check_layout(capture, name)
    old_ws = workspace_of(module, name)
    work = scratch / "work"  # the only place the build process may write
    work.mkdir()
    arch_list = _arch_list(adapter.arch)
    ours = FlashInferCacheAdapter(work / "ws", arch_list, adapter.version)
    ours.workspace_dir.mkdir(parents=True)
    job = work / "job.json"
    job.write_text(json.dumps({"name": name, "generator": made[0], "args": made[1]}))
    env = _build_env(arch_list, work / "ws", context or NodeContext.of())
    step = [sys.executable, "-m", "warmd.libraries.flashinfer.rederive", str(job)]
    run_rebuild([*step, "generate"], env=env, cwd=str(work))
    generated = sorted(p for p in ours.generated_dir.rglob("*") if p.is_file())
    confine_sources(generated, [ours.generated_dir, *_include_roots()])
    _compare_sources(capture / "generated", ours.generated_dir, old_ws,
                     str(ours.workspace_dir.resolve()))
    run_rebuild([*step, "build"], env=env, cwd=str(work))
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


def _build_env(arch_list: str, workspace_base: Path, context: NodeContext) -> dict[str, str]:
    """The environment of the generate and build steps: the node's, with FlashInfer's
    worker environment for the scratch workspace, without the variables that reshape a
    build."""
    from warmd.libraries.flashinfer.executor import worker_env

    env = {**os.environ, **context.child_env(), **worker_env(arch_list, workspace_base),
           "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    for knob in ("FLASHINFER_EXTRA_CFLAGS", "FLASHINFER_EXTRA_CUDAFLAGS",
                 "FLASHINFER_EXTRA_LDFLAGS", "FLASHINFER_NVCC_LAUNCHER",
                 "FLASHINFER_CXX_LAUNCHER"):
        env.pop(knob, None)  # this node's build, not one a variable reshapes
    return env


def _include_roots() -> list[Path]:
    """FlashInfer's package (its csrc and include trees), found without importing it."""
    import importlib.util

    spec = importlib.util.find_spec("flashinfer")
    if spec is None or not spec.submodule_search_locations:
        raise CannotRederiveHere("FlashInfer is not installed here")
    return [Path(p) for p in spec.submodule_search_locations]


def _compare_sources(captured: Path, ours: Path, old_ws: str, new_ws: str) -> None:
    """RederiveMismatch when a generated source the capture records is not FlashInfer's."""
    if not captured.is_dir():
        return
    for src in sorted(p for p in captured.rglob("*") if p.is_file()):
        rel = src.relative_to(captured)
        mine = ours / rel
        text = src.read_bytes().replace(old_ws.encode(), new_ws.encode())
        if not mine.is_file() or mine.read_bytes() != text:
            raise RederiveMismatch(f"the capture's generated source {rel} is not what this "
                                   "node's FlashInfer generates for the module")


def _arch_list(directory: str) -> str:
    """FlashInfer's arch list from its directory name: '90a' -> '9.0a', '80_90a' ->
    '8.0 9.0a'."""
    items = [re.fullmatch(r"(\d+)(\d)([af]?)", item) for item in directory.split("_")]
    if not all(items):
        raise CannotRederiveHere(f"unknown FlashInfer arch directory {directory!r}")
    return " ".join(f"{m.group(1)}.{m.group(2)}{m.group(3)}" for m in items)


# ----- in the rebuild process (FLASHINFER_WORKSPACE_BASE is the scratch workspace) -----

def _rebuild(job: dict, step: str) -> None:
    """generate: the generator writes the module's sources and build file; build: the
    same, then FlashInfer builds the module."""
    from warmd.libraries.base import resolve
    from warmd.libraries.flashinfer.executor import _convert_args

    spec = resolve(job["generator"])(*_convert_args(job["args"]))
    if spec.name != job["name"]:
        sys.exit(f"refused: {job['generator']} makes {spec.name}, not {job['name']}")
    if step == "build":
        spec.build()


if __name__ == "__main__":
    _rebuild(json.loads(Path(sys.argv[1]).read_text()), sys.argv[2])
