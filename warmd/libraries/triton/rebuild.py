"""The rebuild process of a Triton claim (``python -m warmd.libraries.triton.rebuild job.json
out/``, started by rederive.py's ``run_rebuild``): the allow-listed modules' function of
the kernel's name imported, the specialisations the claim's literals allow searched (at
most MAX_SPECIALIZATIONS keys, each a hash, nothing compiled) for the one whose key is the
claim's, and that one compiled with this node's Triton; result.json says what it found.
"""

from __future__ import annotations

import base64
import itertools
import json
import re
import sys
from pathlib import Path

from warmd import settings
from warmd.cache.base import UnsafeArtifact
from warmd.libraries.triton.cache import GROUP_RE

MAX_SPECIALIZATIONS = 1 << 16  # keys one claim's search may hash (~5 s)


def entry_name(digest: str) -> str:
    """The directory Triton's cache keeps a key's files in (base32 of its sha256)."""
    return base64.b32encode(bytes.fromhex(digest)).decode().rstrip("=")


def _functions(kernel: str, modules: list[str], failed: list[str]) -> list:
    """The module-level @triton.jit functions named kernel in the allow-listed modules
    (a package: every module of it whose file defines the name), found on disk and only
    those modules imported; failed gets each module that defines it but did not import."""
    import importlib
    import importlib.util

    from triton.runtime.jit import JITFunction

    defines = re.compile(rf"^def\s+{kernel}\s*\(", re.M)
    found = []
    for top in modules:
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            continue
        if spec is None or spec.origin is None:
            continue
        files = ([Path(spec.origin)] if not spec.submodule_search_locations else
                 sorted(p for root in spec.submodule_search_locations
                        for p in Path(root).rglob("*.py")))
        for path in files[:50000]:
            try:
                if not defines.search(path.read_text(errors="replace")):
                    continue
            except OSError:
                continue
            name = top if not spec.submodule_search_locations else _module_name(
                top, spec.submodule_search_locations, path)
            try:
                fn = getattr(importlib.import_module(name), kernel, None)
            except Exception as exc:  # a module that does not import holds nothing we run
                failed.append(f"{name} does not import here ({type(exc).__name__})")
                continue
            for _ in range(4):  # Autotuner, Heuristics: .fn is what they wrap
                if isinstance(fn, JITFunction) or fn is None:
                    break
                fn = getattr(fn, "fn", None)
            if isinstance(fn, JITFunction) and fn.__name__ == kernel:
                found.append(fn)
    return found


def _module_name(top: str, roots, path: Path) -> str:
    for root in roots:
        try:
            rel = path.relative_to(root).with_suffix("")
        except ValueError:
            continue
        parts = [p for p in rel.parts if p != "__init__"]
        return ".".join([top, *parts])
    return top


def _specializations(fn, job: dict):
    """(signature, constexprs, attrs) the claim's literals allow for fn: every argument in
    the IR a runtime argument of fn; any other parameter None or 1 (what Triton's
    specialisation turns into constexprs) unless it is a constexpr: first as its use in
    fn suggests (a test: a bool; a dtype argument: a dtype; else a number of the IR or a
    small power of two), then any of those, None or a common dtype (a bool default: only a
    bool, a dtype default: only a dtype)."""
    by_name = {a["name"]: a for a in job["args"]}
    params = fn.params
    if [p.name for p in params if p.name in by_name] != [a["name"] for a in job["args"]]:
        return
    attrs = [{(i,): [["tt.divisibility", 16]] if by_name.get(p.name, {}).get("div") else []
              for i, p in enumerate(params)}]  # as Triton's launcher gives them
    if not any(a["div"] for a in job["args"]):
        attrs.append({})  # an ASTSource made by hand, without attributes
    for choices in _choices(fn, job, by_name):
        for picked in itertools.product(*choices):
            signature, constexprs = {}, {}
            for p, value in zip(params, picked, strict=True):
                if p.name in by_name:
                    signature[p.name] = value
                else:
                    signature[p.name] = "constexpr"
                    constexprs[p.name] = value
            for attr in attrs:
                yield signature, constexprs, attr


def _choices(fn, job: dict, by_name: dict) -> list[list[list]]:
    """The candidates of each parameter: the narrow ones (as used), then the wide ones."""
    import triton.language as tl

    numbers = _unique([*job["ints"], 1, 2, 4, 8, 16, 32, 64, 128, 256])
    dtypes = [tl.float16, tl.bfloat16, tl.float32, tl.float8e4nv, tl.float8e5, tl.int8,
              tl.int32, tl.int64]
    tests, typed = _uses(fn)
    narrow, wide = [], []
    for p in fn.params:
        if p.name in by_name:
            both = [by_name[p.name]["types"]] * 2
        elif not p.is_constexpr:
            both = [[None, 1]] * 2
        elif isinstance(p.default, bool):
            both = [[p.default, not p.default]] * 2
        elif isinstance(p.default, tl.dtype):
            both = [_unique([p.default, *dtypes])] * 2
        else:
            first = [p.default] if isinstance(p.default, int) else []
            likely = ([False, True] if p.name in tests else dtypes if p.name in typed
                      else _unique([*first, *numbers]))
            both = [likely, _unique([*likely, True, False, *numbers, None, *dtypes])]
        narrow.append(both[0])
        wide.append(both[1])
    return [narrow, wide]


def _unique(values: list) -> list:
    """values without repeats, True, 1 and 1.0 apart (Triton's key tells them apart)."""
    seen: dict[tuple[type, str], object] = {}
    for value in values:
        seen.setdefault((type(value), str(value)), value)
    return list(seen.values())


def _uses(fn) -> tuple[set[str], set[str]]:
    """Names fn's source tests (if, while, and/or/not) and passes as a dtype."""
    import ast

    tests, typed = set(), set()
    for node in ast.walk(fn.parse()):
        if isinstance(node, (ast.If, ast.While, ast.IfExp)):
            tests |= {n.id for n in [node.test] if isinstance(n, ast.Name)}
        elif isinstance(node, ast.BoolOp):
            tests |= {n.id for n in node.values if isinstance(n, ast.Name)}
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not) \
                and isinstance(node.operand, ast.Name):
            tests.add(node.operand.id)
        elif isinstance(node, ast.Call):
            typed |= {k.value.id for k in node.keywords
                      if k.arg == "dtype" and isinstance(k.value, ast.Name)}
            if isinstance(node.func, ast.Attribute) and node.func.attr == "to":
                typed |= {a.id for a in node.args[:1] if isinstance(a, ast.Name)}
    return tests, typed


def find_specialisation(fns: list, job: dict, backend, options, env_vars):
    """The function and specialisation whose key is the claim's, or None and why."""
    import hashlib

    from triton.compiler import ASTSource
    from triton.runtime.cache import get_cache_key

    class Hashed:  # the options' hash, computed once (it is the same for every key)
        def __init__(self, digest: str) -> None:
            self.digest = digest

        def hash(self) -> str:
            return self.digest

    hashed, tried = Hashed(options.hash()), 0
    for fn in fns:
        for signature, constexprs, attrs in _specializations(fn, job):
            tried += 1
            if tried > MAX_SPECIALIZATIONS:
                return None, f"over {MAX_SPECIALIZATIONS} specialisations to try"
            src = ASTSource(fn, signature, constexprs, attrs)
            key = get_cache_key(src, backend, hashed, env_vars=env_vars)
            if hashlib.sha256(key.encode()).hexdigest() == job["hash"]:
                return (src, options), ""
    return None, f"{tried} specialisations of {len(fns)} function(s) tried"


def _rebuild(job: dict, out: Path) -> dict:
    """Find the function, the specialisation with the claim's key, compile it; write the
    files Triton wrote for that key into out."""
    import triton
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    failed: list[str] = []
    fns = _functions(job["kernel"], job["modules"], failed)
    if not fns:
        return {"outcome": "no-function",
                "why": f"no @triton.jit function named {job['kernel']} in "
                       f"{', '.join(job['modules']) or 'no module'}"
                       + "".join(f"; {f}" for f in failed[:3])}
    target = GPUTarget("cuda", job["arch"], 32)
    backend = make_backend(target)
    options = backend.parse_options(dict(job["options"]))
    found, why = find_specialisation(fns, job, backend, options, get_cache_invalidating_env_vars())
    if found is None:
        return {"outcome": "too-many" if why.startswith("over") else "mismatch", "why": why}
    compiled = triton.compile(found[0], target=target, options=job["options"])
    if compiled.hash != job["hash"]:
        return {"outcome": "mismatch", "why": "the compile's key is not the claim's"}
    entry = settings.triton_cache_dir() / entry_name(job["hash"])
    for path in entry.iterdir():
        if not GROUP_RE.match(path.name):
            (out / path.name).write_bytes(path.read_bytes())
    return {"outcome": "built"}


if __name__ == "__main__":
    try:
        done = _rebuild(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]))
    except UnsafeArtifact as exc:
        sys.exit(f"refused: {exc}")
    (Path(sys.argv[2]) / "result.json").write_text(json.dumps(done))
