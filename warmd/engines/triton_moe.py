"""Which Triton fused-MoE configs an engine compiles for a layer: one kernel per config its
tuned table (or, without one, get_default_config) picks for the token counts the layer sees.

vLLM, vllm/model_executor/layers/fused_moe/fused_moe.py: get_config_file_name names the table
E=<experts>,N=<intermediate per rank>,device_name=<GPU>[,dtype=fp8_w8a8][,block_shape=[..]]
(any H200 family GPU reads NVIDIA_H200's); _get_configured_moe_config takes the config of the
closest batch size in it. 0.34.0 adds `<table>_down` tables for 128x128 block FP8: where the
closest batch size's config sets USE_TMA, the down GEMM is a TMA kernel of its own
(experts/triton_moe.py TritonExperts.apply; on sm90 with DeepGEMM's E8M0 scales).

SGLang, python/sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py
get_moe_configs: its own tables, under configs/triton_<version>/ for the Triton it imports
(else the newest directory that has the table), the device name as reported (no H200-family
folding) and the block shape as Python prints a list ([128, 128]).

The tables of the followed releases are indexed in warmd/engines/data/<engine>-<version>-
moe-configs.json (scripts/tools/engine_flags.py).
"""

from __future__ import annotations

import bisect
import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from warmd.engines.cli_args import FOLLOWED

_DATA = Path(__file__).parent / "data"
# get_default_config for block FP8: the config changes above these M (rule
# vllm-triton-moe-default); bf16 and per-tensor FP8 change at these.
_DEFAULT_EDGES_BLOCK = (4, 8, 16, 64)
_DEFAULT_EDGES_OTHER = (32, 64, 96, 128, 512)


@dataclass(frozen=True)
class MoeConfigs:
    """The configs one Triton fused-MoE layer needs for M in [lo, hi]."""

    table: str
    tuned: bool  # a tuned table of the release (else get_default_config)
    buckets: tuple[int, ...]  # the table's batch sizes reached (tuned), or bucket lower ends
    tma_down: tuple[int, ...] = ()  # vLLM: batch sizes reached whose _down config uses TMA

    def describe(self) -> str:
        shown = f"M buckets {', '.join(str(b) for b in self.buckets)}"
        where = f"tuned table {self.table}" if self.tuned else \
            f"no tuned table {self.table}: get_default_config"
        text = f"{len(self.buckets)} configs ({shown}; {where})"
        if self.tma_down:
            text += (f"; plus {len(self.tma_down)} TMA down-GEMM configs (M buckets "
                     f"{', '.join(str(b) for b in self.tma_down)}; {self.table}_down, on "
                     "sm90 with DeepGEMM E8M0 scales)")
        return text


@cache
def _index(engine: str) -> dict:
    return json.loads((_DATA / f"{engine}-{FOLLOWED[engine]}-moe-configs.json").read_text())


def device_file_name(gpu_name: str) -> str:
    """get_device_name_as_file_name (vllm/utils/platform_utils.py): runs of spaces and
    slashes become _."""
    name = re.sub(r"[\s/]+", "_", gpu_name)
    return "NVIDIA_H200" if "H200" in name.split("_") else name


def table_name(experts: int, n: int, gpu_name: str, dtype: str | None,
               block: tuple[int, int] | None, engine: str = "vllm") -> str:
    dtype_part = f",dtype={dtype}" if dtype else ""
    if engine == "sglang":
        block_part = f",block_shape=[{block[0]}, {block[1]}]" if block else ""
        device = gpu_name.replace(" ", "_")
    else:
        block_part = f",block_shape=[{block[0]},{block[1]}]" if block else ""
        device = device_file_name(gpu_name)
    return f"E={experts},N={n},device_name={device}{dtype_part}{block_part}"


def _tables(engine: str, name: str, triton: str | None) -> list[int] | None:
    """The batch sizes of the table the engine reads: vLLM's one directory; SGLang's
    directory for the Triton it imports, else the newest that has the table."""
    tables = _index(engine)["tables"]
    if engine != "sglang":
        return tables.get("", {}).get(name)
    own = f"triton_{triton.replace('.', '_')}" if triton else None
    if own in tables and name in tables[own]:
        return tables[own][name]
    newest = sorted((d for d in tables if d.startswith("triton_")),
                    key=lambda d: tuple(int(p) for p in d[7:].split("_")), reverse=True)
    return next((tables[d][name] for d in newest if name in tables[d]), None)


def moe_configs(experts: int, n: int, gpu_name: str, dtype: str | None,
                block: tuple[int, int] | None, lo: int, hi: int, engine: str = "vllm",
                triton: str | None = None) -> MoeConfigs:
    """The tuned batch sizes nearest to some M in [lo, hi] (ties go to the smaller key, as
    min() keeps the first), or get_default_config's buckets; for vLLM 128x128 block FP8, the
    reached batch sizes of its `_down` table whose config uses TMA."""
    name = table_name(experts, n, gpu_name, dtype, block, engine)
    keys = _tables(engine, name, triton)
    down = _tables(engine, f"{name}_down", triton) if engine == "vllm" and \
        block == (128, 128) else None
    tma = set(_index(engine)["tma"].get(f"{name}_down", ()))
    tma_down = tuple(k for k in (down or ()) if k in tma and _reached(down, k, lo, hi))
    if keys:
        return MoeConfigs(name, True, tuple(k for k in keys if _reached(keys, k, lo, hi)),
                          tma_down)
    if engine == "sglang":
        # SGLang's get_default_config: one block-FP8 config; else one up to M = E, one above.
        edges: tuple[int, ...] = () if block else (experts,)
    else:
        edges = _DEFAULT_EDGES_BLOCK if block else _DEFAULT_EDGES_OTHER
    starts = (1, *(e + 1 for e in edges))
    return MoeConfigs(name, False, tuple(s for i, s in enumerate(starts)
                                         if s <= hi and (i + 1 == len(starts)
                                                         or starts[i + 1] > lo)), tma_down)


def _reached(keys: list[int], key: int, lo: int, hi: int) -> bool:
    """Whether the closest key of some M in [lo, hi] is key."""
    i = bisect.bisect_left(keys, key)
    first = lo if i == 0 else max(lo, (keys[i - 1] + key) // 2 + 1)
    last = hi if i + 1 == len(keys) else min(hi, (key + keys[i + 1]) // 2)
    return first <= last
