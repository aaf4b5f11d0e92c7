"""An engine release's Python source, read without installing or importing it: an unpacked
wheel directory or the wheel itself. Rule rows cite a file and a symbol of it; this module
finds a symbol's source and digests it, so a new release's changes to what a rule follows
are found by comparing digests (scripts/tools/engine_drift.py), and the engines' argument
definitions can be read by AST (scripts/tools/engine_flags.py)."""

from __future__ import annotations

import ast
import hashlib
import zipfile
from dataclasses import dataclass
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

    def names(self, prefix: str, suffix: str = ".py") -> list[str]:
        """Every file ending in suffix under prefix (a package path), as paths inside the
        tree."""
        if self._zip is not None:
            return sorted(n for n in self._zip.namelist()
                          if n.startswith(prefix) and n.endswith(suffix))
        base = self.root / prefix
        return sorted(str(p.relative_to(self.root)) for p in base.rglob(f"*{suffix}"))


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
    return rule_changes(followed, rule_digests(tree, rules), rules)


def rule_changes(before_digests: dict, after_digests: dict, rules) -> list[tuple]:
    """(rule, 'changed' | 'absent' | 'new') for every rule whose digest differs between two
    releases' rule digests."""
    found = []
    for rule in rules:
        before, after = before_digests.get(rule.id), after_digests.get(rule.id)
        if before == after:
            continue
        found.append((rule, "absent" if after is None else "new" if before is None
                      else "changed"))
    return found


# The modules that decide which kernels an engine compiles and where it caches them: every
# top-level symbol of these is digested, cited by a rule or not, so that a release changing
# any of them is reviewed (scripts/tools/engine_drift.py). Prefixes are package paths in the wheel;
# the files the rules cite are added to them.
DECIDING_MODULES: dict[str, tuple[str, ...]] = {
    "vllm": ("vllm/model_executor/layers/fused_moe/", "vllm/model_executor/layers/quantization/",
             "vllm/model_executor/kernels/linear/", "vllm/model_executor/warmup/",
             "vllm/utils/deep_gemm.py", "vllm/utils/flashinfer.py", "vllm/engine/arg_utils.py",
             "vllm/platforms/", "vllm/envs.py"),
    "sglang": ("sglang/srt/layers/quantization/", "sglang/srt/layers/moe/moe_runner/",
               "sglang/srt/layers/deep_gemm_wrapper/", "sglang/srt/environ.py",
               "sglang/srt/arg_groups/", "sglang/srt/server_args.py", "sglang/__init__.py"),
}
MODULE_LEVEL = "<module>"  # a module's statements that define no named symbol
SYMBOLS_FILE = "{engine}-{version}-symbols.json"


def _digest(nodes) -> str:
    dumped = "\n".join(ast.dump(n, annotate_fields=False, include_attributes=False)
                       for n in nodes)
    return hashlib.sha256(dumped.encode()).hexdigest()[:12]


def _named(node: ast.stmt) -> str | None:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
            isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.id
    return None


def module_symbols(module: ast.Module) -> dict[str, str]:
    """Digest of every top-level symbol: each function, module-level name and class, each
    method as Class.method (the class's own digest leaves its methods' bodies out), and
    MODULE_LEVEL for the rest (imports, environment set at import, if/try blocks)."""
    out: dict[str, str] = {}
    rest = []
    for node in module.body:
        name = _named(node)
        if name is None:
            rest.append(node)
            continue
        if isinstance(node, ast.ClassDef):
            shell = []
            for child in node.body:
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out[f"{name}.{child.name}"] = _digest([child])
                    shell.append(ast.Name(child.name))
                else:
                    shell.append(child)
            out[name] = _digest([*node.bases, *node.decorator_list, *shell])
        else:
            out[name] = _digest([node])
    if rest:
        out[MODULE_LEVEL] = _digest(rest)
    return out


def deciding_files(tree: SourceTree, engine: str, rules=(),
                   prefixes: tuple[str, ...] | None = None) -> list[str]:
    """The package paths of the deciding modules present in tree (DECIDING_MODULES unless
    prefixes are given), cited files included."""
    found: set[str] = set()
    for prefix in DECIDING_MODULES[engine] if prefixes is None else prefixes:
        if prefix.endswith(".py"):
            if tree.read(prefix) is not None:
                found.add(prefix)
        else:
            found.update(tree.names(prefix))
    for rule in rules:
        path = package_path(rule.file)
        if rule.engine == engine and path.endswith(".py") and tree.read(path) is not None:
            found.add(path)
    return sorted(found)


def tree_symbols(tree: SourceTree, engine: str, rules=(),
                 prefixes: tuple[str, ...] | None = None) -> dict[str, dict[str, str]]:
    """file -> symbol -> digest over every deciding module of the release."""
    out = {}
    for path in deciding_files(tree, engine, rules, prefixes):
        try:
            out[path] = module_symbols(tree.parse(path))
        except SyntaxError:
            out[path] = {MODULE_LEVEL: "unparsable"}
    return out


@dataclass(frozen=True)
class SymbolChange:
    file: str  # package path
    symbol: str  # MODULE_LEVEL for the module's other statements, '' for the whole file
    what: str  # changed | added | removed


def symbol_changes(old: dict[str, dict[str, str]],
                   new: dict[str, dict[str, str]]) -> list[SymbolChange]:
    """Every symbol whose digest differs between two releases' tree_symbols; a file only one
    side has is one change with symbol ''."""
    out = []
    for path in sorted(set(old) | set(new)):
        if path not in new or path not in old:
            out.append(SymbolChange(path, "", "removed" if path not in new else "added"))
            continue
        before, after = old[path], new[path]
        for symbol in sorted(set(before) | set(after)):
            if before.get(symbol) == after.get(symbol):
                continue
            what = "added" if symbol not in before else "removed" if symbol not in after \
                else "changed"
            out.append(SymbolChange(path, symbol, what))
    return out


def cites(rule, change: SymbolChange) -> bool:
    """Whether a rule follows the changed symbol: the same symbol, its class, a method of a
    cited class, or the whole file."""
    if package_path(rule.file) != change.file:
        return False
    if not rule.symbol or not change.symbol:
        return True
    return rule.symbol == change.symbol or change.symbol.startswith(rule.symbol + ".")
