"""DeepGEMM's grouped GEMM as vLLM >= 0.33.0 calls it with DeepGEMM 2.x (rules
vllm-moe-psum-layout, vllm-grouped-warmup, vllm-grouped-alignment): serving in the psum
layout on sm90 (sm100 with UE8M0) at the rows of every token count, its own warmup in the
plain layout at the rows of its relax set, both in an alignment scope. The plans here are
checked against numbers worked out from vLLM 0.34.0's source (deep_gemm_utils.py
compute_aligned_M_and_alignment, deep_gemm_warmup.py _get_grouped_gemm_params); the executor's
calls against a stand-in for DeepGEMM, which needs a GPU this machine does not have."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from warmd.kernels.base import Environment
from warmd.libraries.deep_gemm import calls, gemms
from warmd.libraries.deep_gemm.kernels import vllm_grouped_alignment
from warmd.mvalues import relax_m_values, vllm_grouped_rows
from warmd.plan import PlanRequest, make_plan
from warmd.probes import LibraryProbe
from warmd.targets import PRESETS
from warmd.tasks import Task

ROOT = Path(__file__).resolve().parents[2]
QWEN = str(ROOT / "tests" / "data" / "models" / "qwen3-235b-a22b-fp8")
DEEP_GEMM_MOE = (("VLLM_MOE_USE_DEEP_GEMM", "1"),)
BASE = PlanRequest(model=QWEN, tp=4, target="h200", with_libs=("deep_gemm", "flashinfer", "nvcc"),
                   without_libs=("sgl_kernel",), engine_env=DEEP_GEMM_MOE,
                   engine_version="0.34.0")


def grouped(plan) -> dict[tuple, Task]:
    return {(t.n, t.spec.get("layout")): t for t in plan.tasks
            if t.kernel == "m_grouped_fp8_gemm_nt_contiguous"}


def serving_rows(tokens: int = 8192, topk: int = 8, experts: int = 128) -> list[int]:
    # compute_aligned_M_and_alignment: T < 16 activates 8T experts (8T x 128 rows), from
    # T = 16 all 128 are active: 8T + 128 x 127, rounded up to 128.
    small = [1024 * t for t in range(1, 16)]
    return small + list(range(16384, -(-(tokens * topk + experts * 127) // 128) * 128 + 1, 128))


def test_vllm_serves_the_moe_in_the_psum_layout_and_warms_it_plain():
    plan = make_plan(BASE)
    tasks = grouped(plan)
    assert set(tasks) == {(768, "psum"), (768, "contiguous"), (4096, "psum"),
                          (4096, "contiguous")}
    for n in (768, 4096):
        psum, plain = tasks[(n, "psum")], tasks[(n, "contiguous")]
        assert psum.spec["alignment"] == plain.spec["alignment"] == 128
        assert list(psum.m) == serving_rows() and len(psum.m) == 527
        # The warmup's token set: the relax set over 8192 tokens with N = max(768, 4096).
        tokens = {*relax_m_values(8192, 4096, 132, tuple(range(16, 257, 16))), 8192}
        assert list(plain.m) == sorted({vllm_grouped_rows(t, 8, 128) for t in tokens})
        assert len(plain.m) == 516 and 3072 not in plain.m and 3072 in psum.m
    assert psum.key != plain.key  # another kernel.cu, another task


def test_without_e8m0_the_wrapper_sends_small_batches_to_triton_but_vllm_warms_them():
    plan = make_plan(replace(BASE, engine_env=(*DEEP_GEMM_MOE,
                                               ("VLLM_USE_DEEP_GEMM_E8M0", "0"))))
    tasks = grouped(plan)
    # TritonOrDeepGemmExperts: DeepGEMM from 128 tokens in traffic; its warmup calls
    # DeepGEMM directly at every token count of its set, 1 included.
    assert min(tasks[(768, "psum")].m) == vllm_grouped_rows(128, 8, 128)
    assert min(tasks[(768, "contiguous")].m) == vllm_grouped_rows(1, 8, 128) == 1024


@pytest.mark.parametrize("target,env,layouts", [
    ("b200", DEEP_GEMM_MOE, {"psum", "contiguous"}),  # sm100 with UE8M0: psum
    ("rtx-pro-6000", DEEP_GEMM_MOE, {"contiguous"}),  # sm120: plain only
])
def test_the_layout_follows_the_gpu(target, env, layouts):
    plan = make_plan(replace(BASE, target=target, engine_env=env))
    assert {layout for _, layout in grouped(plan)} == layouts
    if layouts == {"contiguous"}:  # serving and warmup share one task
        task = grouped(plan)[(768, "contiguous")]
        assert set(serving_rows(plan.mspec.moe_tokens)) <= set(task.m)


def test_deep_gemm_2_8_keeps_a_128_row_alignment_everywhere():
    # get_theoretical_mk_alignment_for_contiguous_layout in 2.8.1: 256 on sm100, else 128;
    # vLLM only shrinks its 128 to a smaller value.
    for preset in ("h200", "b200", "rtx-pro-6000"):
        env = Environment(PRESETS[preset], {}, "vllm")
        assert vllm_grouped_alignment(env) == 128


def test_older_vllm_keeps_the_plain_calls():
    old = make_plan(replace(BASE, engine_version="0.32.0"))
    assert {layout for _, layout in grouped(old)} == {None}


@pytest.mark.parametrize("version", ["0.1.0", "0.1.4.post1"])
def test_an_external_sgl_deep_gemm_0_1_serves_vllms_psum_layout(version):
    # Every sgl-deep-gemm 0.1.x takes use_psum_layout (m_grouped_fp8_fp4_gemm_nt_contiguous
    # in its __init__.py), and vLLM 0.34.0's DeepGemmExperts.apply passes it on sm90 whatever
    # DeepGEMM it imports: on the H200 vLLM's calls compiled 8 psum kernels a plain-only plan
    # missed (docs/benchmarks.md, warmd verify).
    from warmd.plan import build_plan

    plan = make_plan(BASE)
    probe = LibraryProbe("deep_gemm", True, version, can_jit=True, module="deep_gemm")
    env = replace(plan.env, libraries={**plan.env.libraries, "deep_gemm": probe})
    tasks = grouped(build_plan(plan.model, env, plan.mspec))
    assert {t.spec["layout"] for t in tasks.values()} == {"psum", "contiguous"}


def test_an_external_sgl_deep_gemm_0_2_serves_vllms_psum_layout():
    # sgl-deep-gemm 0.2.3.post2 (a deep_jit release) takes use_psum_layout, as 2.8.1 does:
    # vLLM, which imports an external deep_gemm first, calls it as it calls its vendored one.
    from warmd.plan import build_plan

    plan = make_plan(BASE)
    probe = LibraryProbe("deep_gemm", True, "0.2.3.post2", can_jit=True, module="deep_gemm")
    env = replace(plan.env, libraries={**plan.env.libraries, "deep_gemm": probe})
    tasks = grouped(build_plan(plan.model, env, plan.mspec))
    assert set(tasks) == set(grouped(plan))
    assert {t.spec["layout"] for t in tasks.values()} == {"psum", "contiguous"}


def test_deepep_high_throughput_sends_every_aligned_row_count():
    # ExpertTokensMetadata.make_from_list: the counts are on the CPU, each expert padded
    # exactly, so every multiple of 128 up to the worst case can reach the GEMM.
    plan = make_plan(replace(BASE, tp=2, dp=2, ep=4, max_tokens=1024,
                             launch_args=(("all2all_backend", "deepep_high_throughput"),)))
    psum = grouped(plan)[(3072, "psum")]  # EP: whole experts, 32 a rank
    assert list(psum.m) == list(range(128, vllm_grouped_rows(2048, 8, 32) + 1, 128))
    plain = make_plan(replace(BASE, tp=2, dp=2, ep=4, max_tokens=1024))  # allgather
    assert list(grouped(plain)[(3072, "psum")].m) == sorted(
        {vllm_grouped_rows(t, 8, 32) for t in range(1, 2049)})


# ----- the executor's calls -----

class FakeDeepGemmWithoutGpu:
    """Stands in for DeepGEMM 2.8.1's Python API (no GPU here): records each grouped call
    with the alignment in force during it."""

    __name__ = "fake_deep_gemm"

    def __init__(self) -> None:
        self.alignment, self.calls = 128, []

    def get_mk_alignment_for_contiguous_layout(self) -> int:
        return self.alignment

    def set_mk_alignment_for_contiguous_layout(self, value: int) -> None:
        self.alignment = value

    def m_grouped_fp8_gemm_nt_contiguous(self, a, b, d, grouped_layout, recipe=None,
                                         compiled_dims="nk", disable_ue8m0_cast=False,
                                         use_psum_layout=False):
        self.calls.append((len(a[0]), list(grouped_layout), use_psum_layout, self.alignment))


def _task(layout: str, alignment: int = 64, m=(128, 256)) -> Task:
    return Task("deep_gemm", "m_grouped_fp8_gemm_nt_contiguous", 256, 512, 3, m,
                spec={"scale_fmt": "float32", "layout": layout, "alignment": alignment},
                key="deep_gemm/x")


def _inputs(spec: gemms.GemmSpec, block: int) -> dict:
    rows = max(spec.m)
    inputs = {"a": (list(range(rows)), list(range(rows))), "b": None, "d": list(range(rows))}
    if spec.layout == "psum":
        inputs["psum"] = {m: gemms.psum_layout_ends(m, spec.num_groups, block) for m in spec.m}
    else:
        inputs["layout"] = [(i // block) % spec.num_groups for i in range(rows)]
    return inputs


def test_psum_tasks_call_deep_gemm_with_the_psum_layout_in_an_alignment_scope():
    spec = gemms.gemm_spec(_task("psum"))
    assert spec.gemm_type == "MGroupedContiguousWithPsumLayout" and spec.alignment == 64
    fake = FakeDeepGemmWithoutGpu()
    call = calls.caller(fake, spec, _inputs(spec, 64))
    call(128)
    call(256)
    # Each expert ends on an aligned block; the last end is the row count.
    assert fake.calls == [(128, [64, 128, 128], True, 64), (256, [128, 192, 256], True, 64)]
    assert fake.alignment == 128  # restored after every call


def test_plain_tasks_keep_the_expert_id_layout_in_the_scope():
    spec = gemms.gemm_spec(_task("contiguous"))
    assert spec.gemm_type == "MGroupedContiguous"
    fake = FakeDeepGemmWithoutGpu()
    calls.caller(fake, spec, _inputs(spec, 64))(128)
    assert fake.calls == [(128, [0] * 64 + [1] * 64, False, 64)] and fake.alignment == 128


def test_psum_is_refused_where_deep_gemm_has_none():
    class OldDeepGemm(FakeDeepGemmWithoutGpu):
        def m_grouped_fp8_gemm_nt_contiguous(self, a, b, d, m_indices):  # 0.1.x signature
            raise AssertionError("not to be called")

    spec = gemms.gemm_spec(_task("psum", 128))
    with pytest.raises(ValueError, match="no psum layout"):
        calls.caller(OldDeepGemm(), spec, _inputs(spec, 128))


@pytest.mark.parametrize("spec,match", [
    ({"layout": "zigzag"}, "unknown grouped layout"),
    ({"layout": "psum", "alignment": 100}, "multiple of 16"),
    ({"layout": "psum", "alignment": 256}, "multiples of the alignment 256"),
])
def test_bad_layouts_are_refused(spec, match):
    task = replace(_task("psum"), spec={"scale_fmt": "float32", **spec})
    with pytest.raises(ValueError, match=match):
        gemms.gemm_spec(task)
    dense = Task("deep_gemm", "fp8_gemm_nt", 256, 512, None, (1,), spec={"layout": "psum"},
                 key="deep_gemm/d")
    with pytest.raises(ValueError, match="contiguous grouped GEMMs only"):
        gemms.gemm_spec(dense)


def test_psum_layout_ends_spread_whole_blocks():
    assert gemms.psum_layout_ends(128 * 5, 3, 128) == [256, 512, 640]
    assert gemms.psum_layout_ends(128, 4, 128) == [128, 128, 128, 128]


# ----- scripts/bench/deepgemm_engine_pattern.py, without a GPU -----

def _pattern(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_MOE_USE_DEEP_GEMM": "1"}
    return subprocess.run([sys.executable, "scripts/bench/deepgemm_engine_pattern.py", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_engine_pattern_dry_run_finds_every_grouped_call_planned():
    serve = ["--", "vllm", "serve", QWEN, "--tensor-parallel-size", "4"]
    flags = ["--target", "h200", "--with", "deep_gemm", "--with", "flashinfer"]
    done = _pattern("--dry-run", "--json", *flags, "--engine-version", "0.34.0", *serve)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["uncovered"] == {}
    rows = {(r["shape"], r["layout"]): r for r in report["pattern"]}
    assert rows[("128x768x4096", "psum")]["calls"] == 527
    assert rows[("128x768x4096", "contiguous")]["calls"] == 516
    # Dense: vLLM's warmup set plus every M its DeepGEMM branch serves (32..8192).
    assert rows[("2304x4096", "dense")]["m_max"] == 8192
    # Tasks planned by the rules before 0.33.0 (every 128-row multiple, plain layout) cover
    # the warmup's calls but miss serving's psum calls, and the script says so.
    old = _pattern("--dry-run", "--json", *flags, "--engine-version", "0.32.0", *serve)
    assert old.returncode == 1
    assert set(json.loads(old.stdout)["uncovered"]) == {"128x768x4096 psum A=128",
                                                        "128x4096x384 psum A=128"}


def test_engine_pattern_refuses_a_non_vllm_command():
    done = _pattern("--dry-run", "--", "python", "-m", "sglang.launch_server", "--model-path",
                    QWEN, "--tp", "4")
    assert done.returncode == 2 and "vllm serve" in done.stderr
    assert "Traceback" not in done.stderr
