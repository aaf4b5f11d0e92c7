"""Generate the serve-command flags each engine release accepts, from its released source
(an unpacked wheel or the .whl itself; read by AST, never imported or installed), into
warmd/engines/data/<engine>-<version>.json, and for vLLM the index of its tuned Triton
fused-MoE config tables (<engine>-<version>-moe-configs.json). warmd.engines.cli_args builds
an argparse parser from that data, so a serve command is accepted or refused as the engine's
own parser would.

    python scripts/tools/engine_flags.py /work/engines/vllm-0.34.0 /work/engines/sglang-0.5.23

vLLM (read in vllm_flags.py; vllm/entrypoints/common/cli_args.py make_arg_parser): the
explicit add_argument calls, FrontendArgs' fields (BaseFrontendArgs.add_cli_args: one
--field per dataclass field) and EngineArgs.add_cli_args / AsyncEngineArgs.add_cli_args,
whose `**x_kwargs["field"]` take their action from the config dataclass field's type
(vllm/engine/arg_utils.py _compute_kwargs: bool -> BooleanOptionalAction, which
FlexibleArgumentParser registers as EnableDisableAction; bool | str | None -> nargs '?';
list/set/tuple[..., ...] -> nargs '+').

SGLang (read in sglang_flags.py; python/sglang/srt/server_args.py ServerArgs.add_cli_args):
every field of the _INPUT_NAMESPACES classes annotated A[T, help] or A[T, Arg(...)]
(arg_groups/arg_utils.py add_cli_args_from_dataclass), then the explicit add_argument calls.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sglang_flags import sglang_flags  # noqa: E402
from vllm_flags import vllm_flags  # noqa: E402

from warmd.engines.sources import SourceTree  # noqa: E402

OUT = Path(__file__).resolve().parents[2] / "warmd" / "engines" / "data"

# Where each engine keeps its tuned Triton fused-MoE config tables (vLLM: fused_moe.py
# get_moe_configs; SGLang: moe_runner/triton_utils/fused_moe_triton_config.py get_moe_configs,
# one directory per Triton version).
MOE_CONFIG_DIRS = {"vllm": "vllm/model_executor/layers/fused_moe/configs/",
                   "sglang": "sglang/srt/layers/moe/moe_runner/triton_utils/configs/"}


def moe_config_index(tree: SourceTree, engine: str) -> dict:
    """The engine's tuned Triton fused-MoE tables: {"tables": {directory: {table name: the
    batch sizes it has a config for}}, "tma": {table name: the batch sizes whose config sets
    USE_TMA}} (directory: "" for vLLM, triton_X_Y_Z for SGLang; vLLM 0.34.0's `_down`
    tables hold the TMA down-GEMM configs, experts/triton_moe.py TritonExperts.apply)."""
    prefix = MOE_CONFIG_DIRS[engine]
    tables: dict[str, dict[str, list[int]]] = {}
    tma: dict[str, list[int]] = {}
    for path in tree.names(prefix, ".json"):
        directory, _, name = path[len(prefix):].rpartition("/")
        name = name[:-len(".json")]
        table = json.loads(tree.read(path))
        keys = sorted(int(k) for k in table if k.isdigit())
        tables.setdefault(directory, {})[name] = keys
        marked = sorted(int(k) for k, v in table.items()
                        if k.isdigit() and isinstance(v, dict) and v.get("USE_TMA"))
        if marked:
            tma[name] = marked
    return {"tables": tables, "tma": tma}


# The files the flag tables are read from (each engine's parser definitions and the config
# classes their types come from): their digest is recorded with the table.
SOURCE_PREFIXES = {"vllm": ("vllm/config/", "vllm/engine/", "vllm/entrypoints/",
                            "vllm/utils/argparse_utils.py"),
                   "sglang": ("sglang/srt/server_args.py", "sglang/srt/arg_groups/",
                              "sglang/cli/serve.py")}


def source_digest(tree: SourceTree, engine: str) -> str:
    """sha256 over the path and text of every file the engine's flag table is read from."""
    digest = hashlib.sha256()
    for prefix in SOURCE_PREFIXES[engine]:
        paths = [prefix] if prefix.endswith(".py") else tree.names(prefix)
        for path in paths:
            digest.update(f"{path}\n{tree.read(path) or ''}\n".encode())
    return digest.hexdigest()[:16]


def generate(root: Path, out_dir: Path = OUT) -> Path:
    tree = SourceTree(root)
    engine = "vllm" if tree.read("vllm/engine/arg_utils.py") else "sglang"
    data = vllm_flags(tree) if engine == "vllm" else sglang_flags(tree)
    version = tree.version()
    seen: set[str] = set()
    for option in data["options"]:  # argparse refuses a string twice: the first one holds
        option["strings"] = [s for s in option["strings"] if s not in seen]
        seen.update(option["strings"])
    data["options"] = [o for o in data["options"] if o["strings"]]
    out = {"engine": engine, "version": version, "allow_abbrev": True,
           "source_digest": source_digest(tree, engine), **data}
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{engine}-{version}.json"
    path.write_text(json.dumps(out, indent=0, sort_keys=True) + "\n")
    configs = out_dir / f"{engine}-{version}-moe-configs.json"
    configs.write_text(json.dumps(moe_config_index(tree, engine), separators=(",", ":"),
                                  sort_keys=True) + "\n")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sources", nargs="+", type=Path,
                        help="an unpacked engine wheel or the .whl file")
    parser.add_argument("--out", type=Path, default=OUT,
                        help=f"where the tables go (default {OUT})")
    args = parser.parse_args()
    for root in args.sources:
        path = generate(root, args.out)
        count = len(json.loads(path.read_text())["options"])
        print(f"{path}: {count} options")


if __name__ == "__main__":
    main()
