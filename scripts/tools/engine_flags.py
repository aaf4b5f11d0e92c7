"""Generate the serve-command flags each engine release accepts, from its released source
(an unpacked wheel or the .whl itself; read by AST, never imported or installed), into
warmd/engines/data/<engine>-<version>.json, and for vLLM the index of its tuned Triton
fused-MoE config tables (<engine>-<version>-moe-configs.json). warmd.engines.cli_args builds
an argparse parser from that data, so a serve command is accepted or refused as the engine's
own parser would.

    python scripts/tools/engine_flags.py /work/engines/vllm-0.34.0 /work/engines/sglang-0.5.23

vLLM (vllm/entrypoints/common/cli_args.py make_arg_parser): the explicit add_argument calls,
FrontendArgs' fields (BaseFrontendArgs.add_cli_args: one --field per dataclass field) and
EngineArgs.add_cli_args / AsyncEngineArgs.add_cli_args, whose `**x_kwargs["field"]` take
their action from the config dataclass field's type (vllm/engine/arg_utils.py
_compute_kwargs: bool -> BooleanOptionalAction, which FlexibleArgumentParser registers as
EnableDisableAction; bool | str | None -> nargs '?'; list/set/tuple[..., ...] -> nargs '+').

SGLang (python/sglang/srt/server_args.py ServerArgs.add_cli_args): every field of the
_INPUT_NAMESPACES classes annotated A[T, help] or A[T, Arg(...)]
(arg_groups/arg_utils.py add_cli_args_from_dataclass), then the explicit add_argument calls.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from warmd.engines.sources import SourceTree  # noqa: E402

OUT = Path(__file__).resolve().parents[2] / "warmd" / "engines" / "data"
_BOOL_ACTIONS = ("BooleanOptionalAction",)
_SWITCH_ACTIONS = ("store_true", "store_false", "store_const", "count", "help", "version",
                   "DeprecatedStoreTrueAction")


def _option(strings: list[str], dest: str, nargs, choices=None, negatives=(),
            enable_disable: bool = False) -> dict:
    strings = list(strings)
    known = choices.get("known") if isinstance(choices, dict) else None
    choices = None if known is not None else choices
    negs = list(negatives)
    if nargs == "bool":
        nargs = 0
        for s in list(strings):
            if s.startswith("--"):
                negs.append("--no-" + s[2:])
        if enable_disable:
            for s in list(strings):
                for prefix, inverse in (("--enable-", "--disable-"),
                                        ("--disable-", "--enable-")):
                    if s.startswith(prefix):
                        negs.append(inverse + s[len(prefix):])
    out = {"strings": strings + [n for n in negs if n not in strings], "dest": dest,
           "nargs": nargs}
    if negs:
        out["negatives"] = negs
    if choices:
        out["choices"] = [str(c) for c in choices]
    if known:
        out["known"] = [str(c) for c in known]
    return out


def _const(node):
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return None


def _kw(call: ast.Call, name: str):
    return next((k.value for k in call.keywords if k.arg == name), None)


def _action_name(node) -> str | None:
    if node is None:
        return None
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


# ----- vLLM -----

class _Index:
    """Classes and module-level type aliases of a source tree."""

    def __init__(self, tree: SourceTree, prefixes: tuple[str, ...]):
        self.classes: dict[str, ast.ClassDef] = {}
        self.aliases: dict[str, ast.expr] = {}
        for prefix in prefixes:
            for name in tree.names(prefix):
                module = tree.parse(name)
                for node in module.body:
                    if isinstance(node, ast.ClassDef):
                        self.classes.setdefault(node.name, node)
                    elif isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                            isinstance(node.targets[0], ast.Name):
                        self.aliases.setdefault(node.targets[0].id, node.value)
                    elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                            and node.value is not None:
                        self.aliases.setdefault(node.target.id, node.value)

    def is_dataclass(self, name: str) -> bool:
        cls = self.classes.get(name)
        if cls is None:
            return False
        for dec in cls.decorator_list:
            target = dec.func if isinstance(dec, ast.Call) else dec
            label = _action_name(target)
            if label in ("config", "dataclass"):
                return True
        return False

    def fields(self, name: str) -> dict[str, ast.expr]:
        """Annotated fields of a dataclass, its bases' first."""
        cls = self.classes.get(name)
        if cls is None:
            return {}
        out: dict[str, ast.expr] = {}
        for base in cls.bases:
            base_name = _action_name(base)
            if base_name and base_name in self.classes:
                out.update(self.fields(base_name))
        for node in cls.body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and \
                    "ClassVar" not in ast.unparse(node.annotation):
                out[node.target.id] = node.annotation
        return out

    def members(self, annotation: ast.expr, depth: int = 0) -> list[ast.expr]:
        """The members of a union annotation, aliases expanded."""
        if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
            annotation = ast.parse(annotation.value, mode="eval").body
        if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
            return self.members(annotation.left, depth) + self.members(annotation.right, depth)
        if isinstance(annotation, ast.Subscript):
            head = _action_name(annotation.value)
            if head in ("Optional", "Union"):
                inner = annotation.slice
                parts = inner.elts if isinstance(inner, ast.Tuple) else [inner]
                out = [m for p in parts for m in self.members(p, depth)]
                return out + ([ast.Constant(None)] if head == "Optional" else [])
            if head == "Annotated":
                return self.members(annotation.slice.elts[0], depth)
        if isinstance(annotation, ast.Name) and depth < 5 and annotation.id in self.aliases \
                and annotation.id not in self.classes:
            value = self.aliases[annotation.id]
            if isinstance(value, (ast.BinOp, ast.Subscript, ast.Name)):
                return self.members(value, depth + 1)
        return [annotation]

    def literal_values(self, literal: ast.Subscript, depth: int = 0) -> list[str]:
        """A Literal's values, Literal aliases inside it expanded (Literal["auto", X])."""
        elts = literal.slice.elts if isinstance(literal.slice, ast.Tuple) else [literal.slice]
        out = []
        for elt in elts:
            if isinstance(elt, ast.Name) and depth < 5 and elt.id in self.aliases:
                for inner in self.members(self.aliases[elt.id]):
                    if isinstance(inner, ast.Subscript) and \
                            _action_name(inner.value) == "Literal":
                        out += self.literal_values(inner, depth + 1)
                continue
            value = _const(elt)
            if value is not None:
                out.append(str(value))
        return out

    def kind(self, annotation: ast.expr):
        """(nargs, choices) as vLLM's _compute_kwargs derives them."""
        members = self.members(annotation)
        heads = []
        for m in members:
            if isinstance(m, ast.Constant) and m.value is None:
                heads.append("None")
            elif isinstance(m, ast.Subscript):
                heads.append(_action_name(m.value) or "?")
            else:
                heads.append(_action_name(m) or "?")
        if any(self.is_dataclass(h) for h in heads):
            return 1, None
        if set(heads) == {"bool", "str", "None"}:
            return "?", None
        if "bool" in heads:
            return "bool", None
        optional = ["None"] if "None" in heads else []  # optional_type: "None" -> None
        literals = [m for m in members if isinstance(m, ast.Subscript)
                    and _action_name(m.value) == "Literal"]
        if literals:
            choices = sorted({c for lit in literals for c in self.literal_values(lit)})
            # Literal | str: argparse takes any text (metavar); the config validates it later
            return 1, ({"known": choices} if "str" in heads else choices + optional)
        for m in members:
            head = _action_name(m.value) if isinstance(m, ast.Subscript) else None
            if head in ("tuple", "Tuple"):
                args = m.slice.elts if isinstance(m.slice, ast.Tuple) else [m.slice]
                if any(isinstance(a, ast.Constant) and a.value is Ellipsis for a in args):
                    return "+", None
                return len(args), None
            if head in ("list", "List", "set", "Set"):
                inner = [i for i in self.members(m.slice) if isinstance(i, ast.Subscript)
                         and _action_name(i.value) == "Literal"]
                values = sorted({c for lit in inner for c in self.literal_values(lit)})
                return "+", (values + optional if values else None)
        return 1, None


def _function(cls: ast.ClassDef, name: str) -> ast.FunctionDef:
    return next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name)


def _vllm_calls(func: ast.FunctionDef, index: _Index) -> list[dict]:
    """The options of every add_argument call in a function body."""
    kwargs_of: dict[str, str] = {}  # variable -> config class of get_kwargs(...)
    field_of: dict[str, tuple[str, str]] = {}  # variable -> (class, field)
    nargs_set: dict[tuple[str, str], object] = {}
    lowered: set[str] = set()  # variables whose "type" lowercases and turns - into _
    out = []
    for node in ast.walk(func):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            if isinstance(target, ast.Name) and isinstance(value, ast.Call) and \
                    _action_name(value.func) == "get_kwargs":
                kwargs_of[target.id] = _action_name(value.args[0])
            elif isinstance(target, ast.Name) and isinstance(value, ast.Subscript) and \
                    isinstance(value.value, ast.Call) and \
                    _action_name(value.value.func) == "get_kwargs":
                field_of[target.id] = (_action_name(value.value.args[0]), _const(value.slice))
            elif isinstance(target, ast.Name) and isinstance(value, ast.Subscript) and \
                    isinstance(value.value, ast.Name) and value.value.id in kwargs_of:
                field_of[target.id] = (kwargs_of[value.value.id], _const(value.slice))
            elif isinstance(target, ast.Subscript) and _const(target.slice) == "type" and \
                    isinstance(value, ast.Lambda) and ".lower()" in ast.unparse(value):
                lowered.add(ast.unparse(target.value))
            elif isinstance(target, ast.Subscript) and _const(target.slice) == "nargs":
                inner = target.value
                if isinstance(inner, ast.Subscript) and isinstance(inner.value, ast.Name):
                    nargs_set[(inner.value.id, _const(inner.slice))] = _const(value)
    removed = _choice_removals(func, index)
    for node in ast.walk(func):
        if not (isinstance(node, ast.Call) and _action_name(node.func) == "add_argument"):
            continue
        strings = [a.value for a in node.args if isinstance(a, ast.Constant)]
        if not strings or not all(isinstance(s, str) for s in strings):
            continue
        option = _vllm_option(node, strings, kwargs_of, field_of, nargs_set, index)
        spread = _spread(node)
        gone = removed.get(ast.unparse(spread)) if spread is not None else None
        if gone and option.get("choices"):
            option["choices"] = [c for c in option["choices"] if c not in gone]
        spread = _spread(node)
        if spread is not None and ast.unparse(spread) in lowered:
            option["lowercase"] = True  # type=lambda s: s.lower().replace("-", "_")
        out.append(option)
    return out


def _choice_removals(func: ast.FunctionDef, index: _Index) -> dict[str, set[str]]:
    """`kwargs["field"]["choices"].remove(X)` calls: the spread expression -> the values
    removed (vLLM drops the passthrough all2all backend from the CLI so)."""
    out: dict[str, set[str]] = {}
    for node in ast.walk(func):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "remove" and node.args):
            continue
        target = node.func.value
        if isinstance(target, ast.Subscript) and _const(target.slice) == "choices":
            value = node.args[0]
            if isinstance(value, ast.Name) and value.id in index.aliases:
                value = index.aliases[value.id]
            if _const(value) is not None:
                out.setdefault(ast.unparse(target.value), set()).add(str(_const(value)))
    return out


def _vllm_choices(node, index: _Index):
    """An add_argument's choices: a literal list, or get_args(SomeLiteral)."""
    if node is None:
        return None
    if isinstance(node, ast.Call) and _action_name(node.func) == "get_args" and \
            isinstance(node.args[0], ast.Name) and node.args[0].id in index.aliases:
        members = index.members(index.aliases[node.args[0].id])
        return [v for m in members if isinstance(m, ast.Subscript)
                and _action_name(m.value) == "Literal" for v in index.literal_values(m)]
    return _const(node)


def _spread(call: ast.Call):
    """The kwargs a call spreads: `**x`, or the `**x` inside `**{**x, "default": None}`."""
    spread = next((k.value for k in call.keywords if k.arg is None), None)
    if isinstance(spread, ast.Dict):
        pairs = zip(spread.keys, spread.values, strict=True)
        spread = next((v for k, v in pairs if k is None), None)
    return spread


def _vllm_option(call, strings, kwargs_of, field_of, nargs_set, index: _Index) -> dict:
    # argparse's own dest: the first long option string, else the first one
    first = next((s for s in strings if s.startswith("--")), strings[0])
    dest = _const(_kw(call, "dest")) or first.lstrip("-").replace("-", "_")
    if not strings[0].startswith("-"):
        return {"strings": [], "dest": strings[0], "positional": True,
                "nargs": _const(_kw(call, "nargs")) or 1}
    spread = _spread(call)
    field_kind = None
    if spread is not None:
        if isinstance(spread, ast.Subscript) and isinstance(spread.value, ast.Name):
            cls, name = kwargs_of.get(spread.value.id), _const(spread.slice)
            key = (spread.value.id, name)
        else:
            cls, name = field_of.get(_action_name(spread), (None, None))
            key = None
        annotation = index.fields(cls).get(name) if cls else None
        if annotation is not None:
            field_kind = index.kind(annotation)
        if key in nargs_set:
            field_kind = (nargs_set[key], None)
    action = _action_name(_kw(call, "action"))
    nargs = _const(_kw(call, "nargs"))
    choices = _vllm_choices(_kw(call, "choices"), index)
    if action in _BOOL_ACTIONS:
        return _option(strings, dest, "bool", enable_disable=True)
    if action in _SWITCH_ACTIONS:
        return _option(strings, dest, 0)
    if nargs is not None:
        return _option(strings, dest, nargs, choices)
    if field_kind is not None:
        kind, field_choices = field_kind
        return _option(strings, dest, kind, choices or field_choices, enable_disable=True)
    return _option(strings, dest, 1, choices)


def _customized_single_values(index: _Index) -> set[str]:
    """FrontendArgs' _customize_cli_kwargs (its and its bases'): fields whose `nargs` is
    deleted or whose action becomes "append" take one value per occurrence."""
    out: set[str] = set()
    for cls_name in ("BaseFrontendArgs", "FrontendArgs"):
        cls = index.classes.get(cls_name)
        func = next((n for n in cls.body if isinstance(n, ast.FunctionDef)
                     and n.name == "_customize_cli_kwargs"), None) if cls else None
        for node in ast.walk(func) if func else ():
            targets = node.targets if isinstance(node, (ast.Delete, ast.Assign)) else []
            for target in targets:
                if not (isinstance(target, ast.Subscript) and
                        isinstance(target.value, ast.Subscript)):
                    continue
                key, field = _const(target.slice), _const(target.value.slice)
                if key == "nargs" and isinstance(node, ast.Delete) or \
                        key == "action" and _const(node.value) == "append":
                    out.add(field)
    return out


def vllm_flags(tree: SourceTree) -> dict:
    # the config classes' and their type aliases' modules first (a name defined twice keeps
    # its first definition), then the rest of the package (aliases such as LogLevel)
    index = _Index(tree, ("vllm/config", "vllm/engine", "vllm/entrypoints", "vllm/"))
    cli = tree.parse("vllm/entrypoints/common/cli_args.py")
    make = next(n for n in cli.body if isinstance(n, ast.FunctionDef)
                and n.name == "make_arg_parser")
    options = _vllm_calls(make, index)
    single = _customized_single_values(index)
    for name, annotation in index.fields("FrontendArgs").items():
        kind, choices = index.kind(annotation)
        if name in single:
            kind = 1
        options.append(_option(["--" + name.replace("_", "-")], name, kind, choices,
                               enable_disable=True))
    arg_utils = tree.parse("vllm/engine/arg_utils.py")
    classes = {n.name: n for n in arg_utils.body if isinstance(n, ast.ClassDef)}
    options += _vllm_calls(_function(classes["EngineArgs"], "add_cli_args"), index)
    options += _vllm_calls(_function(classes["AsyncEngineArgs"], "add_cli_args"), index)
    positional = [o for o in options if o.get("positional")]
    return {"positional": [{"dest": p["dest"], "nargs": p["nargs"]} for p in positional],
            "options": [o for o in options if not o.get("positional")]}


# ----- SGLang -----

def _constants(tree: SourceTree, prefixes: tuple[str, ...]) -> dict[str, list]:
    """Module-level list/tuple constants (choice lists) of the files under prefixes."""
    out: dict[str, list] = {}
    for prefix in prefixes:
        for path in tree.names(prefix):
            for node in tree.parse(path).body:
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                        isinstance(node.targets[0], ast.Name):
                    value = _const(node.value)
                    if isinstance(value, (list, tuple)):
                        out.setdefault(node.targets[0].id, list(value))
    return out


def _choices(node, constants: dict[str, list]):
    if node is None:
        return None
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    value = _const(node)
    return list(value) if isinstance(value, (list, tuple, set)) else None


def _sglang_field(name: str, annotation: ast.expr, constants: dict) -> dict | None:
    if not (isinstance(annotation, ast.Subscript) and _action_name(annotation.value) == "A"):
        return None
    parts = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else []
    if len(parts) < 2:
        return None
    raw, meta = parts[0], parts[1]
    arg: dict = {}
    if isinstance(meta, ast.Call) and _action_name(meta.func) == "Arg":
        arg = {k.arg: k.value for k in meta.keywords}
    elif not (isinstance(meta, ast.Constant) and isinstance(meta.value, str)) and \
            not isinstance(meta, ast.JoinedStr) and not isinstance(meta, ast.BinOp):
        return None
    if _const(arg.get("no_cli")):
        return None
    cli_name = _const(arg.get("cli_name")) or "--" + name.replace("_", "-")
    strings = [cli_name, *(_const(arg.get("aliases")) or [])]
    action = _action_name(arg.get("action"))
    if action is not None:
        if action in _BOOL_ACTIONS:
            return _option(strings, name, "bool")
        if action in _SWITCH_ACTIONS:
            return _option(strings, name, 0)
        kwargs = _const(arg.get("action_kwargs")) or {}
        return _option(strings, name, kwargs.get("nargs", _const(arg.get("nargs")) or "*"))
    text = ast.unparse(raw)
    inner = text.removeprefix("Optional[").removesuffix("]") if text.startswith("Optional[") \
        else text.replace(" | None", "")
    choices = _choices(arg.get("choices"), constants)
    nargs = _const(arg.get("nargs"))
    if inner.startswith("Literal["):
        literal = ast.parse(inner, mode="eval").body
        values = literal.slice.elts if isinstance(literal.slice, ast.Tuple) else [literal.slice]
        return _option(strings, name, nargs or 1, choices or [_const(v) for v in values])
    if (inner.startswith("List[") or inner.startswith("list[")) and "type_parser" not in arg:
        return _option(strings, name, nargs or "+", choices)
    if inner == "bool":
        return _option(strings, name, 0)
    return _option(strings, name, nargs or 1, choices)


def sglang_flags(tree: SourceTree) -> dict:
    server_args = tree.parse("sglang/srt/server_args.py")
    names = next(_const_names(n.value) for n in server_args.body if isinstance(n, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == "_INPUT_NAMESPACES"
                         for t in n.targets))
    constants = _constants(tree, ("sglang/srt/arg_groups", "sglang/srt/server_args.py"))
    classes: dict[str, ast.ClassDef] = {}
    for path in tree.names("sglang/srt/arg_groups/fields"):
        for node in tree.parse(path).body:
            if isinstance(node, ast.ClassDef):
                classes[node.name] = node
    options = []
    for cls_name in names:
        for node in _class_with_bases(classes, cls_name):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                option = _sglang_field(node.target.id, node.annotation, constants)
                if option is not None:
                    options.append(option)
    cls = next(n for n in server_args.body if isinstance(n, ast.ClassDef)
               and n.name == "ServerArgs")
    for call in ast.walk(_function(cls, "add_cli_args")):
        if isinstance(call, ast.Call) and _action_name(call.func) == "add_argument":
            strings = [a.value for a in call.args if isinstance(a, ast.Constant)]
            dest = _const(_kw(call, "dest")) or strings[0].lstrip("-").replace("-", "_")
            action = _action_name(_kw(call, "action"))
            nargs = _const(_kw(call, "nargs"))
            choices = _choices(_kw(call, "choices"), constants)
            if action in _BOOL_ACTIONS:
                options.append(_option(strings, dest, "bool"))
            elif action in _SWITCH_ACTIONS or (action and action.startswith("Deprecated")
                                               and nargs is None and choices is None):
                options.append(_option(strings, dest, 0))
            else:
                options.append(_option(strings, dest, nargs or 1, choices))
    return {"positional": [], "options": options}


def _const_names(node) -> list[str]:
    return [_action_name(e) for e in node.elts]


def _class_with_bases(classes: dict, name: str) -> list:
    cls = classes.get(name)
    if cls is None:
        return []
    body = []
    for base in cls.bases:
        body += _class_with_bases(classes, _action_name(base) or "")
    return body + cls.body


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
