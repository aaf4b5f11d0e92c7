"""sgl-deep-gemm 0.2.3.post2, the DeepGEMM SGLang 0.5.23 pins, on the CPU machine: its real
wheel unpacked (never imported: its _C.so needs CUDA torch; see docs/benchmarks.md), found
by the probe as a deep_jit generation, its cache key computed by warmd exactly as DeepJIT's
own C++ (the wheel's headers, built here with g++) computes it, and one of its kernels
compiled by nvcc for sm_90a from the job warmd emits, into the entry DeepGEMM would load.
sgl-deep-gemm 0.1.4.post1's wheel is the other generation beside it."""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from wheels import unpacked_site

from warmd import knobs, settings
from warmd.libraries import probe_library
from warmd.libraries.deep_gemm import deep_jit
from warmd.libraries.deep_gemm.cache import (
    COMMITTED,
    DeepGemmCacheAdapter,
    entry_state,
    parse_kernel_source,
)
from warmd.libraries.deep_gemm.compiler import fast_path_problem
from warmd.libraries.deep_gemm.install import Generation, generation_of, resolve
from warmd.libraries.deep_gemm.listed import ListedJob, build_entry, nvcc_version
from warmd.libraries.deep_gemm.nvcc_shim import job_key, parse_compile
from warmd.libraries.deep_gemm.rederive import regenerate

SGLANG_PIN = "sgl-deep-gemm==0.2.3.post2"
OLD = "sgl-deep-gemm==0.1.4.post1"
HARNESS = Path(__file__).parents[1] / "data" / "deep_gemm" / "deep_jit_key"
NVCC = settings.cuda_home() / "bin" / "nvcc"


@pytest.fixture(scope="module")
def dg023(tmp_path_factory) -> Path:
    return unpacked_site(SGLANG_PIN, tmp_path_factory.mktemp("dg023"))


@pytest.fixture(scope="module")
def dg014(tmp_path_factory) -> Path:
    return unpacked_site(OLD, tmp_path_factory.mktemp("dg014"))


@pytest.fixture
def on_path(monkeypatch: pytest.MonkeyPatch):
    """Put a site first on sys.path, hiding any deep_gemm or vllm this machine has."""
    def use(site: Path) -> None:
        kept = [p for p in sys.path if not any(
            (Path(p or ".") / name).exists() for name in ("vllm", "deep_gemm"))]
        monkeypatch.setattr(sys, "path", [str(site), *kept])
        importlib.invalidate_caches()
        probe_library.cache_clear()

    return use


def test_sglangs_pin_is_probed_as_a_deep_jit_release_without_import(dg023, dg014, on_path):
    on_path(dg023)
    probe = probe_library("deep_gemm", "sglang")
    assert probe.available and probe.module == "deep_gemm"
    assert probe.version == "0.2.3.post2"  # its VERSION file, not the newest release
    assert Path(probe.location) == dg023 / "deep_gemm"
    assert "deep_gemm" not in sys.modules
    found = resolve("sglang")
    assert found.generation is Generation.DEEP_JIT
    # SGLang sets DG_JIT_USE_NVRTC=0 always; DeepJIT has no NVRTC path: the fast path runs
    assert fast_path_problem(found, {"DG_JIT_USE_NVRTC": "0"}) is None
    on_path(dg014)
    old = resolve("sglang")
    assert old.version == "0.1.4.post1" and old.generation is Generation.NVCC_JIT
    assert fast_path_problem(old, {"DG_JIT_USE_NVRTC": "0"}) is None
    assert "NVRTC" in fast_path_problem(old, {"DG_JIT_USE_NVRTC": "1"})


def test_the_fingerprint_of_0_2_holds_no_install_path_and_0_1_does(dg023, dg014, on_path):
    """DeepJIT keys on header contents (its include directory is no flag in the key);
    0.1.4.post1 hashes -I<package>/include."""
    seen = {}
    for site in (dg023, dg014):
        on_path(site)
        seen[site] = DeepGemmCacheAdapter(site / "cache", "sm_90a", 132).fingerprint_inputs()
    new, old = seen[dg023], seen[dg014]
    assert (new["version"], new["generation"], new["install_path"]) == \
        ("0.2.3.post2", "deep_jit", None)
    assert old["generation"] == "nvcc_jit" and old["install_path"] == str(dg014 / "deep_gemm")
    assert new["include_digest"] and new["include_digest"] != old["include_digest"]


def test_the_wheel_configures_deep_jit_as_warmd_models_it(dg023):
    """What deep_jit.py takes as data, found in the wheel: the key's composition
    (runtime.hpp), the default flags (options.hpp), DeepGEMM's additions and signature
    (its _C.so) and the nvcc call's form (backend.hpp)."""
    include = dg023 / "deep_gemm" / "include" / "deep_jit"
    runtime = (include / "runtime" / "runtime.hpp").read_text()
    assert re.search(r"hash_base\.update\(this->config\.extra_signature\);\s*"
                     r"hash_base\.update\(this->backend\.compiler_info\.get_hash\(\)\);", runtime)
    assert re.search(r"options\.update_hash\(hash\);\s*return hash\.update\(options\."
                     r"get_post_hook_hash\(config\)\)\s*\.update\(parser\.parse_into_hash"
                     r"\(source\)\)", runtime)
    options = (include / "backend" / "cuda" / "options.hpp").read_text()
    vector = re.search(r"\.nvcc_flags = std::vector<std::string> \{(.*?)\n\s*\}", options, re.S)
    assert re.findall(r'"([^"]+)"', vector.group(1)) == [
        "-std=c++{}", "JIT_CPP_STANDARD", "--compiler-options=-fPIC",
        "--compiler-options=-fconcepts", "--expt-relaxed-constexpr", "--expt-extended-lambda"]
    assert 'env.get<int>("JIT_CPP_STANDARD", 20)' in options
    defaults = deep_jit.default_flags((9, 0))
    assert defaults[4:9] == ["-std=c++20", "--compiler-options=-fPIC",
                             "--compiler-options=-fconcepts", "--expt-relaxed-constexpr",
                             "--expt-extended-lambda"]
    assert '.optimize_level = "3"' in options and ".ptxas_register_usage_level = 10" in options
    extension = (dg023 / "deep_gemm" / "_C.so").read_bytes()
    for text in ("cutlass-", "--diag-suppress=39,161,174,177,186,940",
                 "--compiler-options=-Wno-deprecated-declarations,-Wno-abi",
                 "-gencode=arch=compute_120f,code=sm_120f", "100f", "120f"):
        assert f"\0{text}\0".encode() in extension, text
    assert deep_jit.config_of(dg023 / "deep_gemm").extra_signature == "cutlass-421"
    backend = (include / "backend" / "cuda" / "backend.hpp").read_text()
    assert '"--cubin",\n            "--output-file",' in backend
    assert 'args.emplace_back("--include-path");' in backend
    assert 'env.get<std::string>("JIT_CACHE_DIR")' in (include / "cache" / "disk.hpp").read_text()


@pytest.fixture(scope="module")
def key_harness(dg023, tmp_path_factory) -> Path:
    """DeepJIT's own hashing code from the wheel, built with the machine's g++."""
    gxx = shutil.which("g++")
    if gxx is None or not (settings.cuda_home() / "include" / "cuda.h").is_file():
        pytest.skip("needs g++ and the CUDA toolkit's headers")
    binary = tmp_path_factory.mktemp("harness") / "key"
    subprocess.run([gxx, "-std=c++20", "-O1", f"-I{HARNESS / 'shim'}",
                    f"-I{dg023 / 'deep_gemm' / 'include'}",
                    f"-I{settings.cuda_home() / 'include'}", str(HARNESS / "key.cpp"),
                    "-o", str(binary)], check=True, capture_output=True, timeout=300)
    return binary


def _cpp_key(harness: Path, package: Path, version_text: str, source: str, flags: list[str],
             tmp: Path) -> tuple[list[str], str]:
    (tmp / "nvcc-version.txt").write_text(version_text)
    (tmp / "kernel.cu").write_text(source)
    arch = flags[0].removeprefix("--gpu-architecture=sm_")
    line_info = "1" if "--generate-line-info" in flags else "0"
    tail = flags[flags.index("--ptxas-options=--register-usage-level=10") + 1:]
    tail = [f for f in tail if f != "--generate-line-info"]
    out = subprocess.run([str(harness), str(package / "include"),
                          deep_jit.config_of(package).extra_signature,
                          str(tmp / "nvcc-version.txt"), str(tmp / "kernel.cu"), arch,
                          line_info, *tail], check=True, capture_output=True, text=True,
                         timeout=60).stdout.split()
    return out[:-1], out[-1]


@pytest.mark.parametrize("capability,env", [((9, 0), {}),
                                            ((10, 0), {"DJ_JIT_WITH_LINEINFO": "yes"})])
def test_warmds_key_is_the_one_deep_jits_own_code_computes(dg023, key_harness, tmp_path,
                                                          capability, env):
    package = dg023 / "deep_gemm"
    config = deep_jit.config_of(package)
    flags = deep_jit.default_flags(capability, env)
    sources = [deep_jit.template_source(package, "transpose_fp32", [512, 64, 32, 32]),
               deep_jit.template_source(package, "sm90_fp8_gemm_1d2d_impl", [
                   "cute::UMMA::Major::K", 0, 2304, 4096, 1, 64, 16, 128, 128, 128, 32, 16,
                   128, 128, 1, "false", 132, "GemmType::Normal", "cutlass::bfloat16_t",
                   "epilogue::transform::EpilogueIdentity", 128])]
    versions = ["Cuda compilation tools, release 13.0, V13.0.88\n", nvcc_version(str(NVCC))]
    keys = set()
    for source in sources:
        for version in versions:
            cpp_flags, cpp_key = _cpp_key(key_harness, package, version, source, flags,
                                          tmp_path)
            assert cpp_flags == flags
            key = deep_jit.cache_key(config, version, flags, source)
            assert key == cpp_key and re.fullmatch(r"[0-9a-f]{32}", key)
            keys.add(key)
    assert len(keys) == 4  # the source (headers included) and the nvcc version both count


def test_0_2_generated_sources_read_as_deep_gemm_kernels(dg023):
    """The adapter's accounting and the re-derivation take 0.2.3.post2's kernel.cu as
    they take 2.8.1's (its template has blank lines and an epilogue type more)."""
    package = dg023 / "deep_gemm"
    gemm = deep_jit.template_source(package, "sm90_fp8_gemm_1d2d_impl", [
        "cute::UMMA::Major::K", 0, 2304, 4096, 1, 64, 16, 128, 128, 128, 32, 16, 128, 128, 1,
        "false", 132, "GemmType::Normal", "cutlass::bfloat16_t",
        "epilogue::transform::EpilogueIdentity", 128])
    parsed = parse_kernel_source(gemm)
    assert parsed.impl == "sm90_fp8_gemm_1d2d_impl" and parsed.gemm_type == "Normal"
    assert parsed.args[-2:] == ("epilogue::transform::EpilogueIdentity", "128")
    transpose = deep_jit.template_source(package, "transpose_fp32", [512, 64, 32, 32])
    for name, source in (("sm90_fp8_gemm_1d2d.0", gemm), ("transpose_fp32.0", transpose)):
        assert regenerate(package, name, source).strip() == source.strip()
    with pytest.raises(ValueError, match="fewer template arguments"):
        deep_jit.template_source(package, "transpose_fp32", [512, 64, 32, 32, 1])


def test_the_key_follows_the_headers_text_not_the_install_path(dg023, tmp_path):
    package = dg023 / "deep_gemm"
    source = deep_jit.template_source(package, "transpose_fp32", [512, 64, 32, 32])
    flags = deep_jit.default_flags((9, 0))
    key = deep_jit.cache_key(deep_jit.config_of(package), "v", flags, source)
    copy = tmp_path / "elsewhere" / "deep_gemm" / "include"
    shutil.copytree(package / "include" / "deep_gemm", copy / "deep_gemm")
    shutil.copytree(package / "include" / "cutlass", copy / "cutlass")
    moved = deep_jit.DeepJitConfig(copy, "cutlass-421")
    assert deep_jit.cache_key(moved, "v", flags, source) == key
    header = copy / "deep_gemm" / "impls" / "smxx_layout.cuh"
    header.write_text(header.read_text() + "\n")
    assert deep_jit.cache_key(moved, "v", flags, source) != key


@pytest.mark.slow  # one real nvcc build of a DeepGEMM kernel
@pytest.mark.skipif(not NVCC.is_file(), reason="needs nvcc")
def test_a_0_2_job_compiles_on_cpu_into_the_entry_deep_gemm_loads(dg023, tmp_path):
    """The job warmd emits for one 0.2.3.post2 kernel: DeepJIT's nvcc call (which the
    kernel stage's shim takes apart like DeepGEMM's), its entry named by DeepJIT's key,
    built by nvcc for sm_90a here as a CPU builder builds a listed kernel."""
    package = dg023 / "deep_gemm"
    config = deep_jit.config_of(package)
    source = deep_jit.template_source(package, "transpose_fp32", [512, 64, 32, 32])
    flags = deep_jit.default_flags((9, 0))
    template = deep_jit.job_template(flags, config)
    build = tmp_path / "dg" / "tmp" / "1234"
    real_call = [str(build / "kernel.cu") if a == "{source}" else
                 str(build / "kernel.cubin") if a == "{output}" else a for a in template]
    assert parse_compile(real_call) == (str(build / "kernel.cu"), str(build / "kernel.cubin"),
                                        template)
    version = nvcc_version(str(NVCC))
    name = deep_jit.entry_name("transpose_fp32",
                               deep_jit.cache_key(config, version, flags, source))
    job = ListedJob(name, job_key(template, source.encode()), tuple(template), source, None,
                    version, str(config.include_dir))
    root = tmp_path / "dg"
    assert build_entry(tmp_path / "run", job, str(NVCC), root, str(config.include_dir)) is None
    entry = root / "cache" / name
    assert entry_state(entry) == "complete"
    assert sorted(p.name for p in entry.iterdir()) == [COMMITTED, "kernel.cu", "kernel.cubin"]
    assert (entry / "kernel.cu").read_text() == source
    cubin = (entry / "kernel.cubin").read_bytes()
    assert cubin[:4] == b"\x7fELF" and b"transpose_fp32" in cubin
    listed = DeepGemmCacheAdapter(root).list_entries()
    assert [e.name for e in listed] == [name] and generation_of("0.2.3.post2") is \
        Generation.DEEP_JIT
    # The engine's side: SGLang's DG_JIT_CACHE_DIR as a lookup list, this root read second;
    # the entry's kernel re-keyed with this node's nvcc and flags gives its own name.
    roots = deep_jit.cache_roots({"DG_JIT_CACHE_DIR": f"{tmp_path / 'own'}:{root}"}, tmp_path)
    assert deep_jit.lookup(roots, name) == entry
    assert f"{entry.name}" == deep_jit.entry_name(
        "transpose_fp32", deep_jit.entry_key(entry, config, version, flags))
    other = deep_jit.default_flags((9, 0), {"DG_JIT_WITH_LINEINFO": "1"})
    assert deep_jit.entry_key(entry, config, version, other) not in name


def test_deep_jits_cache_dir_is_a_lookup_list_with_its_own_default(tmp_path):
    assert deep_jit.cache_roots({"DG_JIT_CACHE_DIR": "/a:/b", "DJ_JIT_CACHE_DIR": "/c"},
                                tmp_path) == [Path("/a"), Path("/b")]
    assert deep_jit.cache_roots({"DJ_JIT_CACHE_DIR": "/c"}, tmp_path) == [Path("/c")]
    assert deep_jit.cache_roots({}, tmp_path) == [tmp_path / ".dj"]
    with pytest.raises(ValueError, match="empty path"):
        deep_jit.cache_roots({"DG_JIT_CACHE_DIR": "/a::/b"}, tmp_path)
    (tmp_path / "b" / "cache" / "k.0f").mkdir(parents=True)
    assert deep_jit.lookup([tmp_path / "a", tmp_path / "b"], "k.0f") is None  # no marker
    (tmp_path / "b" / "cache" / "k.0f" / COMMITTED).touch()
    assert deep_jit.lookup([tmp_path / "a", tmp_path / "b"], "k.0f") == \
        tmp_path / "b" / "cache" / "k.0f"


def test_every_variable_that_moves_deep_jits_flags_is_in_the_fingerprint(dg023, on_path,
                                                                         monkeypatch):
    options = (dg023 / "deep_gemm" / "include" / "deep_jit" / "backend" / "cuda" /
               "options.hpp").read_text()
    read = set(re.findall(r'env\.get<(?:bool|int)>\("(JIT_[A-Z_]+)"', options))
    dumps = {"JIT_DUMP_ASM", "JIT_DUMP_PTX", "JIT_DUMP_SASS"}  # extra files, same flags
    assert read - dumps == set(deep_jit.FLAG_ENV)
    for name in deep_jit.FLAG_ENV:
        assert {f"DG_{name}", f"DJ_{name}"} <= set(knobs.DEEP_GEMM_KEY_ENV)
    for name in knobs.DEEP_GEMM_KEY_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DJ_JIT_WITH_LINEINFO", "1")
    on_path(dg023)
    adapter = DeepGemmCacheAdapter(dg023 / "cache", "sm_90a", 132)
    assert adapter.fingerprint_inputs()["env"] == {"DJ_JIT_WITH_LINEINFO": "1"}
    assert "--generate-line-info" in deep_jit.default_flags((9, 0), dict(os.environ))


def _defined(path: Path) -> dict[str, list[str]]:
    """Names a module defines at any depth (functions with their parameters, assignments
    with the name they alias), read from its source: 0.2.3.post2 cannot be imported here."""
    import ast

    names: dict[str, list[str]] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef):
            names[node.name] = [a.arg for a in (*node.args.args, *node.args.kwonlyargs)]
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Name):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    names[target.id] = names.get(node.value.id, [])
    return names


def test_the_executor_calls_only_what_0_2_offers(dg023):
    """The executor's calls (gemms.GEMMS, the psum layout, the alignment scope, the
    casts), checked against 0.2.3.post2's Python API as its source defines it."""
    from warmd.libraries.deep_gemm.gemms import GEMMS

    package = dg023 / "deep_gemm"
    api = _defined(package / "__init__.py")
    for functions, _gemm_type in GEMMS.values():
        assert any(f in api for f in functions), functions
    assert "use_psum_layout" in api["m_grouped_fp8_gemm_nt_contiguous"]
    assert "disable_ue8m0_cast" in api["fp8_gemm_nt"]
    layout = _defined(package / "utils" / "layout.py")
    for name in ("get_mk_alignment_for_contiguous_layout",
                 "set_mk_alignment_for_contiguous_layout"):
        assert name in layout  # re-exported by `from .utils import *`
    casts = _defined(package / "utils" / "math.py")
    for name in ("per_token_cast_to_fp8", "per_block_cast_to_fp8"):
        assert "use_ue8m0" in casts[name]


def test_an_sglang_plan_names_the_pinned_deep_gemm_it_would_import(dg023):
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(dg023), str(root)])}
    done = subprocess.run([sys.executable, "-m", "warmd", "plan", "--target", "h200", "--json",
                           "--engine-version", "0.5.23", "--", "python", "-m",
                           "sglang.launch_server", "--model-path",
                           "tests/data/models/qwen3-235b-a22b-fp8", "--tp", "4"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    library = json.loads(done.stdout)["libraries"]["deep_gemm"]
    assert (library["version"], library["module"]) == ("0.2.3.post2", "deep_gemm")
    assert library["location"] == str(dg023 / "deep_gemm")


def test_the_fingerprint_holds_only_what_each_generations_key_reads(dg023, dg014, on_path,
                                                                    monkeypatch):
    """SGLang sets DG_JIT_USE_NVRTC=0 in the engine's process: with either generation the
    fingerprint there equals warmd's, where it is unset. DeepJIT has no NVRTC and reads the
    DJ_ names; 0.1.x reads neither those nor DeepJIT's checks."""
    from warmd.libraries.deep_gemm.cache import key_env
    from warmd.libraries.deep_gemm.install import NVCC_JIT_KEY_ENV

    assert set(knobs.DEEP_GEMM_KEY_ENV) == {*NVCC_JIT_KEY_ENV, *(
        f"{p}_{n}" for p in ("DG", "DJ") for n in deep_jit.KEYED_ENV)}
    for name in knobs.DEEP_GEMM_KEY_ENV:
        monkeypatch.delenv(name, raising=False)

    def fingerprint(site: Path, **env: str) -> dict:
        with monkeypatch.context() as scope:
            for name, value in env.items():
                scope.setenv(name, value)
            on_path(site)
            return DeepGemmCacheAdapter(site / "cache", "sm_90a", 132).fingerprint_inputs()

    for site in (dg023, dg014):
        assert fingerprint(site) == fingerprint(site, DG_JIT_USE_NVRTC="0")
    assert fingerprint(dg023, DG_JIT_USE_NVRTC="1", DG_JIT_PTXAS_CHECK="1")["env"] == {}
    assert fingerprint(dg023, DJ_JIT_DEBUG="1")["env"] == {"DJ_JIT_DEBUG": "1"}
    assert fingerprint(dg014, DG_JIT_USE_NVRTC="1")["env"] == {"DG_JIT_USE_NVRTC": "1"}
    assert fingerprint(dg014, DJ_JIT_DEBUG="1", DG_JIT_CHECK_NO_SPILLS="1")["env"] == {}
    assert key_env(None) == {}  # nothing set; an unknown generation keeps every name set


def test_0_1_keys_are_computed_as_its_jit_named_the_h200s_entries(dg014):
    """The other generation's key (nvcc_jit.py), from 0.1.4.post1's own format strings,
    gives the very names its JIT gave the real entries in tests/data/deep_gemm/cache on the
    H200 (sgl-deep-gemm installed with pip --target /tmp/site, nvcc 13.0, sm_90a); with
    the package elsewhere every name changes."""
    from warmd.libraries.deep_gemm import nvcc_jit

    strings = (dg014 / "deep_gemm" / "_C.so").read_bytes()
    for text in ("{}$${}$${}$${}", "kernel.{}.{}", "NVCC{}.{}", "cd {} && {} {} -cubin -o {} {}",
                 "-std=c++{} --diag-suppress=39,161,174,177,186,940 "
                 "--ptxas-options=--register-usage-level=10",
                 "{} -I{} --gpu-architecture=sm_{} --compiler-options=-fPIC,-O3,-fconcepts,"
                 "-Wno-deprecated-declarations,-Wno-abi -O3 --expt-relaxed-constexpr "
                 "--expt-extended-lambda"):
        assert f"\0{text}\0".encode() in strings, text
    entries = sorted((Path(__file__).parents[1] / "data" / "deep_gemm" / "cache").iterdir())
    version = "Cuda compilation tools, release 13.0, V13.0.88\n"
    for include, same in ((Path("/tmp/site/deep_gemm/include"), True),
                          (dg014 / "deep_gemm" / "include", False)):
        flags = nvcc_jit.default_flags(include)
        for entry in entries:
            name = entry.name.split(".")[1]
            built = nvcc_jit.entry_name(name, version, flags, (entry / "kernel.cu").read_bytes())
            assert (built == entry.name) is same
    assert len(entries) == 4
