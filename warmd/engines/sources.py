"""An engine release's Python source, read without installing or importing it: an unpacked
wheel directory or the wheel itself. Rule rows cite a file and a symbol of it; this module
finds a symbol's source and digests it, so a new release's changes to what a rule follows
are found by comparing digests (scripts/engine_drift.py), and the engines' argument
definitions can be read by AST (scripts/engine_flags.py)."""

from __future__ import annotations

import ast
import hashlib
import zipfile
from pathlib import Path

# Rule rows cite SGLang by its repository path (python/sglang/...); its wheel holds sglang/.
_REPO_PREFIXES = ("python/",)


def package_path(cited: str) -> str:
    """The path inside a wheel of a file a rule row cites."""
    for prefix in _REPO_PREFIXES:
        if cited.startswith(prefix):
            return cited[len(prefix):]
    return cited


class SourceTree:
    """The files of one release: a directory (an unpacked wheel) or a .whl file."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self._zip = zipfile.ZipFile(self.root) if self.root.is_file() else None

    def read(self, cited: str) -> str | None:
        path = package_path(cited)
        if self._zip is not None:
            try:
                return self._zip.read(path).decode()
            except KeyError:
                return None
        file = self.root / path
        return file.read_text() if file.is_file() else None

    def parse(self, cited: str) -> ast.Module | None:
        text = self.read(cited)
        return ast.parse(text) if text is not None else None

    def version(self) -> str:
        """The release's version from its dist-info METADATA."""
        if self._zip is not None:
            meta = next(n for n in self._zip.namelist() if n.endswith(".dist-info/METADATA"))
            text = self._zip.read(meta).decode()
        else:
            text = next(self.root.glob("*.dist-info/METADATA")).read_text()
        return next(line.split(":", 1)[1].strip() for line in text.splitlines()
                    if line.startswith("Version:"))

    def names(self, prefix: str) -> list[str]:
        """Every .py file under prefix (a package path), as paths inside the tree."""
        if self._zip is not None:
            return sorted(n for n in self._zip.namelist()
                          if n.startswith(prefix) and n.endswith(".py"))
        base = self.root / prefix
        return sorted(str(p.relative_to(self.root)) for p in base.rglob("*.py"))


def find_symbol(module: ast.Module, symbol: str) -> ast.AST | None:
    """The node of a dotted symbol: a function, a class, a method (Class.method) or a
    module-level name assigned once (a constant, a table). '' is the whole module."""
    if not symbol:
        return module
    node: ast.AST = module
    for part in symbol.split("."):
        node = _child(node, part)
        if node is None:
            return None
    return node


def _child(node: ast.AST, name: str) -> ast.AST | None:
    for child in getattr(node, "body", ()):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if child.name == name:
                return child
        elif isinstance(child, ast.Assign):
            if any(isinstance(t, ast.Name) and t.id == name for t in child.targets):
                return child
        elif isinstance(child, ast.AnnAssign) and isinstance(child.target, ast.Name) and \
                child.target.id == name:
            return child
    return None


def symbol_digest(tree: SourceTree, cited: str, symbol: str) -> str | None:
    """sha256 of the symbol's syntax tree (comments and layout do not count, docstrings do);
    None when the file or the symbol is gone."""
    module = tree.parse(cited)
    node = find_symbol(module, symbol) if module is not None else None
    if node is None:
        return None
    dumped = ast.dump(node, annotate_fields=False, include_attributes=False)
    return hashlib.sha256(dumped.encode()).hexdigest()[:16]


DIGESTS = Path(__file__).parent / "data" / "rule-digests.json"


def rule_digests(tree: SourceTree, rules) -> dict[str, str | None]:
    """rule id -> digest of its cited symbol in this release (None: file or symbol gone)."""
    return {rule.id: symbol_digest(tree, rule.file, rule.symbol) for rule in rules}


def drift(followed: dict[str, str | None], tree: SourceTree, rules) -> list[tuple]:
    """(rule, what happened) for every rule whose cited source differs in tree from the
    followed release's digests: 'changed', 'absent' (file or symbol missing there), 'new' (the
    followed release had none)."""
    found = []
    now = rule_digests(tree, rules)
    for rule in rules:
        before, after = followed.get(rule.id), now[rule.id]
        if before == after:
            continue
        found.append((rule, "absent" if after is None else "new" if before is None
                      else "changed"))
    return found
