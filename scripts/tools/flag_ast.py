"""What both engines' flag readers (vllm_flags.py, sglang_flags.py) take from an AST: an
option as warmd.engines.cli_args reads it, a literal's value, a call's keyword, an action's
name, a class's method."""

from __future__ import annotations

import ast

BOOL_ACTIONS = ("BooleanOptionalAction",)
SWITCH_ACTIONS = ("store_true", "store_false", "store_const", "count", "help", "version",
                   "DeprecatedStoreTrueAction")


def option_of(strings: list[str], dest: str, nargs, choices=None, negatives=(),
              enable_disable: bool = False) -> dict:
    """An option as warmd.engines.cli_args reads it (a bool one with its negative strings)."""
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


def value_of(node):
    """The node's literal value; None when it is no literal."""
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return None


def kwarg(call: ast.Call, name: str):
    """The value node of the call's keyword argument `name`, if given."""
    return next((k.value for k in call.keywords if k.arg == name), None)


def action_of(node) -> str | None:
    """An action's name: a string, or the last name of an attribute or a name."""
    if node is None:
        return None
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def method_of(cls: ast.ClassDef, name: str) -> ast.FunctionDef:
    return next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name)
