"""vLLM's serve-command flags, read by AST from its released source (for engine_flags.py):
vllm/entrypoints/common/cli_args.py make_arg_parser's explicit add_argument calls,
FrontendArgs' fields and EngineArgs.add_cli_args / AsyncEngineArgs.add_cli_args, whose
`**x_kwargs["field"]` take their action from the config dataclass field's type."""

from __future__ import annotations

import ast

from flag_ast import BOOL_ACTIONS, SWITCH_ACTIONS, action_of, kwarg, method_of, option_of, value_of

from warmd.engines.sources import SourceTree


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
            label = action_of(target)
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
            base_name = action_of(base)
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
            head = action_of(annotation.value)
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
                            action_of(inner.value) == "Literal":
                        out += self.literal_values(inner, depth + 1)
                continue
            value = value_of(elt)
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
                heads.append(action_of(m.value) or "?")
            else:
                heads.append(action_of(m) or "?")
        if any(self.is_dataclass(h) for h in heads):
            return 1, None
        if set(heads) == {"bool", "str", "None"}:
            return "?", None
        if "bool" in heads:
            return "bool", None
        optional = ["None"] if "None" in heads else []  # optional_type: "None" -> None
        literals = [m for m in members if isinstance(m, ast.Subscript)
                    and action_of(m.value) == "Literal"]
        if literals:
            choices = sorted({c for lit in literals for c in self.literal_values(lit)})
            # Literal | str: argparse takes any text (metavar); the config validates it later
            return 1, ({"known": choices} if "str" in heads else choices + optional)
        for m in members:
            head = action_of(m.value) if isinstance(m, ast.Subscript) else None
            if head in ("tuple", "Tuple"):
                args = m.slice.elts if isinstance(m.slice, ast.Tuple) else [m.slice]
                if any(isinstance(a, ast.Constant) and a.value is Ellipsis for a in args):
                    return "+", None
                return len(args), None
            if head in ("list", "List", "set", "Set"):
                inner = [i for i in self.members(m.slice) if isinstance(i, ast.Subscript)
                         and action_of(i.value) == "Literal"]
                values = sorted({c for lit in inner for c in self.literal_values(lit)})
                return "+", (values + optional if values else None)
        return 1, None


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
                    action_of(value.func) == "get_kwargs":
                kwargs_of[target.id] = action_of(value.args[0])
            elif isinstance(target, ast.Name) and isinstance(value, ast.Subscript) and \
                    isinstance(value.value, ast.Call) and \
                    action_of(value.value.func) == "get_kwargs":
                field_of[target.id] = (action_of(value.value.args[0]), value_of(value.slice))
            elif isinstance(target, ast.Name) and isinstance(value, ast.Subscript) and \
                    isinstance(value.value, ast.Name) and value.value.id in kwargs_of:
                field_of[target.id] = (kwargs_of[value.value.id], value_of(value.slice))
            elif isinstance(target, ast.Subscript) and value_of(target.slice) == "type" and \
                    isinstance(value, ast.Lambda) and ".lower()" in ast.unparse(value):
                lowered.add(ast.unparse(target.value))
            elif isinstance(target, ast.Subscript) and value_of(target.slice) == "nargs":
                inner = target.value
                if isinstance(inner, ast.Subscript) and isinstance(inner.value, ast.Name):
                    nargs_set[(inner.value.id, value_of(inner.slice))] = value_of(value)
    removed = _choice_removals(func, index)
    for node in ast.walk(func):
        if not (isinstance(node, ast.Call) and action_of(node.func) == "add_argument"):
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
        if isinstance(target, ast.Subscript) and value_of(target.slice) == "choices":
            value = node.args[0]
            if isinstance(value, ast.Name) and value.id in index.aliases:
                value = index.aliases[value.id]
            if value_of(value) is not None:
                out.setdefault(ast.unparse(target.value), set()).add(str(value_of(value)))
    return out


def _vllm_choices(node, index: _Index):
    """An add_argument's choices: a literal list, or get_args(SomeLiteral)."""
    if node is None:
        return None
    if isinstance(node, ast.Call) and action_of(node.func) == "get_args" and \
            isinstance(node.args[0], ast.Name) and node.args[0].id in index.aliases:
        members = index.members(index.aliases[node.args[0].id])
        return [v for m in members if isinstance(m, ast.Subscript)
                and action_of(m.value) == "Literal" for v in index.literal_values(m)]
    return value_of(node)


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
    dest = value_of(kwarg(call, "dest")) or first.lstrip("-").replace("-", "_")
    if not strings[0].startswith("-"):
        return {"strings": [], "dest": strings[0], "positional": True,
                "nargs": value_of(kwarg(call, "nargs")) or 1}
    spread = _spread(call)
    field_kind = None
    if spread is not None:
        if isinstance(spread, ast.Subscript) and isinstance(spread.value, ast.Name):
            cls, name = kwargs_of.get(spread.value.id), value_of(spread.slice)
            key = (spread.value.id, name)
        else:
            cls, name = field_of.get(action_of(spread), (None, None))
            key = None
        annotation = index.fields(cls).get(name) if cls else None
        if annotation is not None:
            field_kind = index.kind(annotation)
        if key in nargs_set:
            field_kind = (nargs_set[key], None)
    action = action_of(kwarg(call, "action"))
    nargs = value_of(kwarg(call, "nargs"))
    choices = _vllm_choices(kwarg(call, "choices"), index)
    if action in BOOL_ACTIONS:
        return option_of(strings, dest, "bool", enable_disable=True)
    if action in SWITCH_ACTIONS:
        return option_of(strings, dest, 0)
    if nargs is not None:
        return option_of(strings, dest, nargs, choices)
    if field_kind is not None:
        kind, field_choices = field_kind
        return option_of(strings, dest, kind, choices or field_choices, enable_disable=True)
    return option_of(strings, dest, 1, choices)


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
                key, field = value_of(target.slice), value_of(target.value.slice)
                if key == "nargs" and isinstance(node, ast.Delete) or \
                        key == "action" and value_of(node.value) == "append":
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
        options.append(option_of(["--" + name.replace("_", "-")], name, kind, choices,
                                 enable_disable=True))
    arg_utils = tree.parse("vllm/engine/arg_utils.py")
    classes = {n.name: n for n in arg_utils.body if isinstance(n, ast.ClassDef)}
    options += _vllm_calls(method_of(classes["EngineArgs"], "add_cli_args"), index)
    options += _vllm_calls(method_of(classes["AsyncEngineArgs"], "add_cli_args"), index)
    positional = [o for o in options if o.get("positional")]
    return {"positional": [{"dest": p["dest"], "nargs": p["nargs"]} for p in positional],
            "options": [o for o in options if not o.get("positional")]}
