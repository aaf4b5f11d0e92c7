"""SGLang's serve-command flags, read by AST from its released source (for engine_flags.py):
every field of python/sglang/srt/server_args.py's _INPUT_NAMESPACES classes annotated
A[T, help] or A[T, Arg(...)], then ServerArgs.add_cli_args' explicit add_argument calls."""

from __future__ import annotations

import ast

from flag_ast import BOOL_ACTIONS, SWITCH_ACTIONS, action_of, kwarg, method_of, option_of, value_of

from warmd.engines.sources import SourceTree


def _constants(tree: SourceTree, prefixes: tuple[str, ...]) -> dict[str, list]:
    """Module-level list/tuple constants (choice lists) of the files under prefixes."""
    out: dict[str, list] = {}
    for prefix in prefixes:
        for path in tree.names(prefix):
            for node in tree.parse(path).body:
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                        isinstance(node.targets[0], ast.Name):
                    value = value_of(node.value)
                    if isinstance(value, (list, tuple)):
                        out.setdefault(node.targets[0].id, list(value))
    return out


def _choices(node, constants: dict[str, list]):
    if node is None:
        return None
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    value = value_of(node)
    return list(value) if isinstance(value, (list, tuple, set)) else None


def _sglang_field(name: str, annotation: ast.expr, constants: dict) -> dict | None:
    if not (isinstance(annotation, ast.Subscript) and action_of(annotation.value) == "A"):
        return None
    parts = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else []
    if len(parts) < 2:
        return None
    raw, meta = parts[0], parts[1]
    arg: dict = {}
    if isinstance(meta, ast.Call) and action_of(meta.func) == "Arg":
        arg = {k.arg: k.value for k in meta.keywords}
    elif not (isinstance(meta, ast.Constant) and isinstance(meta.value, str)) and \
            not isinstance(meta, ast.JoinedStr) and not isinstance(meta, ast.BinOp):
        return None
    if value_of(arg.get("no_cli")):
        return None
    cli_name = value_of(arg.get("cli_name")) or "--" + name.replace("_", "-")
    strings = [cli_name, *(value_of(arg.get("aliases")) or [])]
    action = action_of(arg.get("action"))
    if action is not None:
        if action in BOOL_ACTIONS:
            return option_of(strings, name, "bool")
        if action in SWITCH_ACTIONS:
            return option_of(strings, name, 0)
        kwargs = value_of(arg.get("action_kwargs")) or {}
        return option_of(strings, name, kwargs.get("nargs", value_of(arg.get("nargs")) or "*"))
    text = ast.unparse(raw)
    inner = text.removeprefix("Optional[").removesuffix("]") if text.startswith("Optional[") \
        else text.replace(" | None", "")
    choices = _choices(arg.get("choices"), constants)
    nargs = value_of(arg.get("nargs"))
    if inner.startswith("Literal["):
        literal = ast.parse(inner, mode="eval").body
        values = literal.slice.elts if isinstance(literal.slice, ast.Tuple) else [literal.slice]
        return option_of(strings, name, nargs or 1, choices or [value_of(v) for v in values])
    if (inner.startswith("List[") or inner.startswith("list[")) and "type_parser" not in arg:
        return option_of(strings, name, nargs or "+", choices)
    if inner == "bool":
        return option_of(strings, name, 0)
    return option_of(strings, name, nargs or 1, choices)


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
    for call in ast.walk(method_of(cls, "add_cli_args")):
        if isinstance(call, ast.Call) and action_of(call.func) == "add_argument":
            strings = [a.value for a in call.args if isinstance(a, ast.Constant)]
            dest = value_of(kwarg(call, "dest")) or strings[0].lstrip("-").replace("-", "_")
            action = action_of(kwarg(call, "action"))
            nargs = value_of(kwarg(call, "nargs"))
            choices = _choices(kwarg(call, "choices"), constants)
            if action in BOOL_ACTIONS:
                options.append(option_of(strings, dest, "bool"))
            elif action in SWITCH_ACTIONS or (action and action.startswith("Deprecated")
                                               and nargs is None and choices is None):
                options.append(option_of(strings, dest, 0))
            else:
                options.append(option_of(strings, dest, nargs or 1, choices))
    return {"positional": [], "options": options}


def _const_names(node) -> list[str]:
    return [action_of(e) for e in node.elts]


def _class_with_bases(classes: dict, name: str) -> list:
    cls = classes.get(name)
    if cls is None:
        return []
    body = []
    for base in cls.bases:
        body += _class_with_bases(classes, action_of(base) or "")
    return body + cls.body
