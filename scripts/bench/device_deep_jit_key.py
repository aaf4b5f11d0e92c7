"""DeepJIT's cache key, checked against a real DeepGEMM on a GPU (results: docs/benchmarks.md).

sgl-deep-gemm 0.2.3.post2 (SGLang 0.5.23's pin) does not load on the lent H200 (its _C.so
needs a newer torch than the device's 2.11); DeepGEMM 2.8.1, vendored in vLLM 0.34.0, does,
and runs the same DeepJIT. This runs 2.8.1's GEMMs into a fresh DG_JIT_CACHE_DIR, then, for
every entry DeepGEMM wrote, recomputes its name with warmd.libraries.deep_gemm.deep_jit
from the entry's kernel.cu, the nvcc command and compiler version of its meta.json and the
package's headers, and compares warmd's default flags with the recorded ones. A second
process with DG_JIT_WITH_LINEINFO=1 checks that an environment flag moves the key as warmd
says. Copies of two entries (and the headers their keys read) go to $OUT for tests/data.

Through the device tool (kind nvidia-h200), from the checkout the tool copies, carrying
.dgcarry/vdg281.tar.xz, made there once (ignored by git) from the vLLM 0.34.0 wheel:
    pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 -d /tmp/v vllm==0.34.0 && \
    unzip -q -d /tmp/v /tmp/v/vllm-0.34.0-*.whl 'vllm/third_party/deep_gemm/*' && \
    mkdir -p .dgcarry && tar -cJf .dgcarry/vdg281.tar.xz -C /tmp/v/vllm/third_party deep_gemm
then run:
    mkdir -p /tmp/x/vllm/third_party && tar -xJf .dgcarry/vdg281.tar.xz \
        -C /tmp/x/vllm/third_party && touch /tmp/x/vllm/__init__.py \
        /tmp/x/vllm/third_party/__init__.py && PYTHONPATH=/tmp/x:$PWD \
        python3 scripts/bench/device_deep_jit_key.py
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHAPES = ((2304, 4096), (7168, 2048))
MS = (1, 64, 256, 1024, 4096)


def run_gemms(root: Path) -> None:
    os.environ["DG_JIT_CACHE_DIR"] = str(root)
    import torch
    import vllm.third_party.deep_gemm as dg
    from vllm.third_party.deep_gemm.utils.math import (
        per_block_cast_to_fp8,
        per_token_cast_to_fp8,
    )

    dg.set_pdl(True)
    for n, k in SHAPES:
        a = per_token_cast_to_fp8(torch.randn(max(MS), k, device="cuda",
                                              dtype=torch.bfloat16), use_ue8m0=False)
        b = per_block_cast_to_fp8(torch.randn(n, k, device="cuda", dtype=torch.bfloat16),
                                  use_ue8m0=False)
        d = torch.empty(max(MS), n, device="cuda", dtype=torch.bfloat16)
        for m in MS:
            dg.fp8_gemm_nt((a[0][:m], a[1][:m]), b, d[:m], disable_ue8m0_cast=True)
    torch.cuda.synchronize()


def check(root: Path, env: dict[str, str]) -> list[dict]:
    from warmd.libraries.deep_gemm import deep_jit

    results = []
    for entry in sorted((root / "cache").iterdir()):
        meta = json.loads((entry / "meta.json").read_text())
        args = shlex.split(meta["command"])
        flags = args[5:args.index("--include-path")]
        include = Path(meta["config"]["include_dirs"][0])
        signature = meta["config"].get("extra_signature")
        config = deep_jit.DeepJitConfig(include, signature or deep_jit.config_of(
            include.parent).extra_signature)
        source = (entry / "kernel.cu").read_bytes()
        key = deep_jit.cache_key(config, meta["compiler_info"]["version"], flags, source)
        name_key = entry.name.rsplit(".", 1)[1]
        results.append({
            "entry": entry.name, "warmd_key": key, "key_matches": key == name_key,
            "flags_match_default": flags == deep_jit.default_flags((9, 0), env),
            "signature_recorded": signature,
            "files": sorted(p.name for p in entry.iterdir()),
            "form": args[2:5] == ["--cubin", "--output-file", args[4]],
            "flags": flags if not results else None,
        })
    return results


def main() -> int:
    out = Path(os.environ.get("OUT", "/tmp/deep-jit-out"))
    out.mkdir(parents=True, exist_ok=True)
    if len(sys.argv) > 1:  # the child: GEMMs only
        run_gemms(Path(sys.argv[1]))
        return 0
    base = Path(tempfile.mkdtemp())
    summary = {}
    for label, extra in (("default", {}), ("lineinfo", {"DG_JIT_WITH_LINEINFO": "1"})):
        root = base / label
        began = time.monotonic()
        subprocess.run([sys.executable, __file__, str(root)], check=True,
                       env={**os.environ, **extra})
        results = check(root, extra)
        summary[label] = {"seconds": round(time.monotonic() - began, 1),
                          "entries": len(results),
                          "keys_match": sum(r["key_matches"] for r in results),
                          "flags_match": sum(r["flags_match_default"] for r in results),
                          "results": results}
        if label == "default":
            keep = out / "entries"
            tags = {}
            for entry in sorted((root / "cache").iterdir()):
                tags.setdefault(entry.name.rsplit(".", 1)[0], entry)
            for entry in list(tags.values())[:2]:
                shutil.copytree(entry, keep / entry.name)
    names = [{r["entry"].rsplit(".", 1)[0] for r in summary[s]["results"]} for s in summary]
    summary["same_kernels_other_keys"] = names[0] == names[1] and not (
        {r["entry"] for r in summary["default"]["results"]}
        & {r["entry"] for r in summary["lineinfo"]["results"]})
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    subprocess.run(["tar", "-czf", str(out / "entries.tar.gz"), "-C", str(out), "entries"],
                   check=False)
    print(json.dumps({k: v if k == "same_kernels_other_keys" else
                      {x: y for x, y in v.items() if x != "results"}
                      for k, v in summary.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
