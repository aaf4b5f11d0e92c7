"""Which Triton fused-MoE configs vLLM compiles for a layer: one kernel per config its tuned
table (or, without one, get_default_config) picks for the token counts the layer sees.

vllm/model_executor/layers/fused_moe/fused_moe.py: get_config_file_name names the table
E=<experts>,N=<intermediate per rank>,device_name=<GPU>[,dtype=fp8_w8a8][,block_shape=[..]]
(any H200 family GPU reads NVIDIA_H200's); _get_configured_moe_config takes the config of the
closest batch size in it. The tables of the followed release are indexed in
warmd/engines/data/vllm-<version>-moe-configs.json (scripts/engine_flags.py).
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

    def describe(self) -> str:
        shown = f"M buckets {', '.join(str(b) for b in self.buckets)}"
        where = f"tuned table {self.table}" if self.tuned else \
            f"no tuned table {self.table}: get_default_config"
        return f"{len(self.buckets)} configs ({shown}; {where})"


@cache
def _index() -> dict[str, list[int]]:
    return json.loads((_DATA / f"vllm-{FOLLOWED['vllm']}-moe-configs.json").read_text())


def device_file_name(gpu_name: str) -> str:
    """get_device_name_as_file_name (vllm/utils/platform_utils.py): runs of spaces and
    slashes become _."""
    name = re.sub(r"[\s/]+", "_", gpu_name)
    return "NVIDIA_H200" if "H200" in name.split("_") else name


def table_name(experts: int, n: int, gpu_name: str, dtype: str | None,
               block: tuple[int, int] | None) -> str:
    dtype_part = f",dtype={dtype}" if dtype else ""
    block_part = f",block_shape=[{block[0]},{block[1]}]" if block else ""
    return f"E={experts},N={n},device_name={device_file_name(gpu_name)}{dtype_part}{block_part}"


def moe_configs(experts: int, n: int, gpu_name: str, dtype: str | None,
                block: tuple[int, int] | None, lo: int, hi: int) -> MoeConfigs:
    """The tuned batch sizes nearest to some M in [lo, hi] (ties go to the smaller key, as
    min() keeps the first), or get_default_config's buckets."""
    name = table_name(experts, n, gpu_name, dtype, block)
    keys = _index().get(name)
    if keys:
        return MoeConfigs(name, True, tuple(k for k in keys if _reached(keys, k, lo, hi)))
    edges = _DEFAULT_EDGES_BLOCK if block else _DEFAULT_EDGES_OTHER
    starts = (1, *(e + 1 for e in edges))
    return MoeConfigs(name, False, tuple(s for i, s in enumerate(starts)
                                         if s <= hi and (i + 1 == len(starts)
                                                         or starts[i + 1] > lo)))


def _reached(keys: list[int], key: int, lo: int, hi: int) -> bool:
    """Whether the closest key of some M in [lo, hi] is key."""
    i = bisect.bisect_left(keys, key)
    first = lo if i == 0 else max(lo, (keys[i - 1] + key) // 2 + 1)
    last = hi if i + 1 == len(keys) else min(hi, (key + keys[i + 1]) // 2)
    return first <= last
