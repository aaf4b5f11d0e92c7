"""Where each library's JIT cache is, as the serving engine resolves it at its start.

The engines set the libraries' cache variables themselves before the libraries read them:
vLLM points DeepGEMM at ``$VLLM_CACHE_ROOT/deep_gemm`` when ``DG_JIT_CACHE_DIR`` is unset;
SGLang always overwrites ``DG_JIT_CACHE_DIR`` with ``$SGLANG_DG_CACHE_DIR``, and ``import
sglang`` defaults ``TRITON_CACHE_DIR`` and ``FLASHINFER_WORKSPACE_BASE`` under
``$SGLANG_CACHE_DIR``. Each rule is a row (``RULES``) citing the engine file and symbol that
does it; ``resolve`` replays them, in the engine's order, on the engine's environment (a
mapping: this process's, a warmd.yaml model's ``env:``, or a manifest's container), then the
libraries' own defaults. The result, ``CacheDirs``, is a typed value the plan carries down to
warmup, the agents and capture; the environment is written only for child processes
(``CacheDirs.child_env``).

As read in vLLM 0.34.0 and SGLang 0.5.23. An empty variable counts as unset, and ``~`` is
expanded in every value (vLLM and SGLang expand it in the values they compute).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from warmd.engines.versions import ALL_VERSIONS, Version, VersionRange
from warmd.errors import WarmdInputError


class How(enum.Enum):
    FORCE = "forced"  # the engine sets the variable whatever it held
    SETDEFAULT = "defaulted"  # the engine sets it when unset (os.environ.setdefault)
    DEFAULT = "default"  # the value a reader takes when the variable is unset


@dataclass(frozen=True)
class CacheRule:
    """One thing an engine (or, with engine None, the library itself) does to a cache
    variable; ``value`` is a template: ``~`` and ``$NAME`` expand as the engine expands them."""

    engine: str | None
    variable: str
    how: How
    value: str
    source: str  # "file:symbol" in the engine's or library's released source
    versions: VersionRange = ALL_VERSIONS


VLLM_ENVS = "vllm/envs.py"
VLLM_DEEP_GEMM = "vllm/utils/deep_gemm.py"
SGLANG_ENVIRON = "python/sglang/srt/environ.py"
SGLANG_DG_COMPILE = "python/sglang/srt/layers/deep_gemm_wrapper/compile_utils.py"

# In the order the engine applies them (SGLang: `import sglang` first, then DeepGEMM's
# wrapper at its import); DEFAULT rows of an engine win over the libraries' own.
RULES: tuple[CacheRule, ...] = (
    CacheRule("vllm", "XDG_CACHE_HOME", How.DEFAULT, "~/.cache",
              f"{VLLM_ENVS}:get_default_cache_root"),
    CacheRule("vllm", "VLLM_CACHE_ROOT", How.DEFAULT, "$XDG_CACHE_HOME/vllm",
              f"{VLLM_ENVS}:environment_variables['VLLM_CACHE_ROOT']"),
    # vLLM sets it when the variable is unset or empty (both count as unset here)
    CacheRule("vllm", "DG_JIT_CACHE_DIR", How.SETDEFAULT, "$VLLM_CACHE_ROOT/deep_gemm",
              f"{VLLM_DEEP_GEMM}:_lazy_init"),
    CacheRule("sglang", "SGLANG_CACHE_DIR", How.DEFAULT, "~/.cache/sglang",
              f"{SGLANG_ENVIRON}:Envs.SGLANG_CACHE_DIR"),
    CacheRule("sglang", "SGLANG_DG_CACHE_DIR", How.DEFAULT, "$SGLANG_CACHE_DIR/deep_gemm",
              f"{SGLANG_ENVIRON}:Envs.SGLANG_DG_CACHE_DIR"),
    CacheRule("sglang", "TRITON_CACHE_DIR", How.SETDEFAULT, "$SGLANG_CACHE_DIR/triton",
              f"{SGLANG_ENVIRON}:third_party_cache_defaults (python/sglang/__init__.py)"),
    CacheRule("sglang", "FLASHINFER_WORKSPACE_BASE", How.SETDEFAULT, "$SGLANG_CACHE_DIR",
              f"{SGLANG_ENVIRON}:third_party_cache_defaults (python/sglang/__init__.py)"),
    CacheRule("sglang", "DG_JIT_CACHE_DIR", How.FORCE, "$SGLANG_DG_CACHE_DIR",
              f"{SGLANG_DG_COMPILE}:module level"),
    CacheRule(None, "TRITON_HOME", How.DEFAULT, "~", "triton/knobs.py:cache_knobs.home_dir"),
    CacheRule(None, "TRITON_CACHE_DIR", How.DEFAULT, "$TRITON_HOME/.triton/cache",
              "triton/knobs.py:cache_knobs.dir"),
    CacheRule(None, "FLASHINFER_WORKSPACE_BASE", How.DEFAULT, "~",
              "flashinfer/jit/env.py:FLASHINFER_WORKSPACE_DIR"),
    CacheRule(None, "FLASHINFER_AUTOTUNE_CACHE_DIR", How.DEFAULT,
              "$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer/autotune",
              "flashinfer/autotune_cache.py:get_default_cache_root"),
    CacheRule(None, "XDG_CACHE_HOME", How.DEFAULT, "~/.cache", "XDG base directories"),
    CacheRule(None, "VLLM_CACHE_ROOT", How.DEFAULT, "$XDG_CACHE_HOME/vllm",
              f"{VLLM_ENVS}:environment_variables['VLLM_CACHE_ROOT']"),
    CacheRule(None, "DG_JIT_CACHE_DIR", How.DEFAULT, "$VLLM_CACHE_ROOT/deep_gemm",
              f"{VLLM_DEEP_GEMM}:_lazy_init"),
)

# Every variable the rules read or write: what a process's environment is read for, what a
# warmd.yaml model's `env:` and a manifest's container may set.
CACHE_VARIABLES: tuple[str, ...] = tuple(dict.fromkeys(
    [r.variable for r in RULES] + ["VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"]))
# What the libraries themselves read: each child process gets them, resolved.
LIBRARY_VARIABLES = ("DG_JIT_CACHE_DIR", "TRITON_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE",
                     "FLASHINFER_AUTOTUNE_CACHE_DIR")
# Read by the engine itself for a library's cache (vLLM's FlashInfer autotune results).
ENGINE_VARIABLES = {"vllm": ("VLLM_CACHE_ROOT",)}

_NAME = re.compile(r"\$(\{)?([A-Za-z_][A-Za-z0-9_]*)(?(1)\})")


class UnresolvedCacheDir(WarmdInputError):
    """A cache directory that cannot be resolved from the environment given (no home, a
    variable nobody sets, a relative path)."""


@dataclass(frozen=True)
class CacheDirs:
    """Each library's cache as one engine, at one version, with one environment, reads it."""

    engine: str
    values: tuple[tuple[str, str], ...]  # cache variable -> absolute path, as the engine holds
    notes: tuple[str, ...] = ()  # how each library's variable was decided, with its source

    def get(self, variable: str) -> Path:
        return Path(dict(self.values)[variable])

    def directories(self) -> dict[str, Path]:
        """Library -> the directory it reads (what `plan --json` shows as ``cache_dirs``)."""
        dirs = {"deep_gemm": self.get("DG_JIT_CACHE_DIR"),
                "triton": self.get("TRITON_CACHE_DIR"),
                "flashinfer": self.get("FLASHINFER_WORKSPACE_BASE") / ".cache" / "flashinfer",
                "flashinfer_autotune": self.get("FLASHINFER_AUTOTUNE_CACHE_DIR")}
        if self.engine == "vllm":
            given = dict(self.values).get("VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR")
            dirs["vllm_flashinfer_autotune"] = (
                Path(given) if given
                else self.get("VLLM_CACHE_ROOT") / "flashinfer_autotune_cache")
        return dirs

    def root(self, variable: str) -> Path | None:
        """The value of a library's root variable (CacheRoot.env); None: no rule covers it."""
        found = dict(self.values).get(variable)
        return Path(found) if found else None

    def child_env(self) -> dict[str, str]:
        """The variables a worker process gets so that its libraries read these caches."""
        values = dict(self.values)
        env = {name: values[name] for name in (*LIBRARY_VARIABLES,
                                                *ENGINE_VARIABLES.get(self.engine, ()))}
        if values.get("VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"):
            env["VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"] = values["VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"]
        return env

    def to_json(self) -> dict[str, str]:
        return {name: str(path) for name, path in self.directories().items()}


def resolve(engine: str, env: Mapping[str, str], home: Path | None,
            version: Version | None = None) -> CacheDirs:
    """The cache directories ``engine`` at ``version`` reads when started with ``env``
    (``home``: its user's home; None when unknown, then a value needing it is an error)."""
    held = {k: v for k, v in env.items() if k in CACHE_VARIABLES and v}
    notes: list[str] = []
    rules = [r for r in RULES if r.engine == engine and r.versions.contains(version)]
    for rule in rules:
        if rule.how is How.DEFAULT:
            continue
        value = _expand(rule.value, held, home, engine, version, rule.variable)
        before = held.get(rule.variable)
        if rule.how is How.FORCE or before is None:
            held[rule.variable] = value
            ignored = f" (the {rule.variable}={before} given is ignored)" \
                if before is not None and before != value else ""
            notes.append(f"{rule.variable}={value}: {rule.how.value} by {engine} "
                         f"({rule.source}){ignored}")
    values = {name: _value(name, held, home, engine, version)
              for name in (*LIBRARY_VARIABLES, *ENGINE_VARIABLES.get(engine, ()))}
    if held.get("VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"):
        values["VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"] = _absolute(
            "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR",
            _expand(held["VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"], held, home, engine, version,
                    "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"))
    return CacheDirs(engine, tuple(sorted(values.items())), tuple(notes))


def _default_rule(variable: str, engine: str, version: Version | None) -> CacheRule | None:
    for owner in (engine, None):
        for rule in RULES:
            if (rule.engine == owner and rule.variable == variable and rule.how is How.DEFAULT
                    and rule.versions.contains(version)):
                return rule
    return None


def _value(variable: str, held: Mapping[str, str], home: Path | None, engine: str,
           version: Version | None, seen: tuple[str, ...] = ()) -> str:
    if variable in seen:
        raise UnresolvedCacheDir(f"{variable} refers to itself")
    if variable in held:
        text = held[variable]
        if text.startswith("$") and text.lstrip("$").lstrip("{").rstrip("}") == variable:
            raise UnresolvedCacheDir(f"{variable} refers to itself")
        return _absolute(variable, _expand(text, held, home, engine, version, variable,
                                           (*seen, variable)))
    rule = _default_rule(variable, engine, version)
    if rule is None:
        raise UnresolvedCacheDir(f"{variable} is not set and {engine} gives it no default")
    return _absolute(variable, _expand(rule.value, held, home, engine, version, variable,
                                       (*seen, variable)))


def _expand(template: str, held: Mapping[str, str], home: Path | None, engine: str,
            version: Version | None, variable: str, seen: tuple[str, ...] = ()) -> str:
    if template == "~" or template.startswith("~/"):
        if home is None:
            raise UnresolvedCacheDir(f"{variable}={template} needs the engine user's home, "
                                     "which is unknown here: set HOME or the variable")
        template = str(home) + template[1:]

    def one(match: re.Match) -> str:
        name = match.group(2)
        if name == "HOME":
            if home is None:
                raise UnresolvedCacheDir(f"{variable} needs $HOME, which is unknown here")
            return str(home)
        if name not in CACHE_VARIABLES:
            raise UnresolvedCacheDir(f"{variable}={template}: ${name} is not a variable warmd "
                                     "can resolve (set the path itself)")
        return _value(name, held, home, engine, version, seen)

    return _NAME.sub(one, template)


def _absolute(variable: str, value: str) -> str:
    if "$(" in value or not value.startswith("/"):
        raise UnresolvedCacheDir(f"{variable}={value} is not an absolute path warmd can "
                                 "resolve")
    return str(Path(value))


def process_cache_dirs(engine: str, version: Version | None,
                       overlay: tuple[tuple[str, str], ...] = (),
                       environ: Mapping[str, str] | None = None) -> CacheDirs:
    """The directories the engine reads when started from a node's variables (default:
    this process's environment), overlaid with ``overlay`` (a warmd.yaml model's `env:`, a
    serve line's variables)."""
    from warmd import knobs

    env = {**knobs.present(CACHE_VARIABLES, environ), **dict(overlay)}
    return resolve(engine, env, knobs.home(), version)
