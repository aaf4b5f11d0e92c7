"""A pasted serve command plans exactly what the equivalent flags plan, and both follow the
engines' source: vLLM's deep_gemm_warmup.py (DP x max_num_batched_tokens capped by
VLLM_FUSED_MOE_CHUNK_SIZE), fused_moe/config.py (EP = TP x DP), SGLang's compile_utils.py
(precompile range and fast set) and server_args.py (DeepEP sets ep_size = tp_size)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from tests.plan_support import (
    MODELS,
    from_command,
    from_flags,
    model,
    picked,
    selection,
)
from warmd.engines.decide_sglang import sglang_fast_max, sglang_m_max
from warmd.engines.versions import parse_version, resolve_version
from warmd.errors import WarmdInputError
from warmd.mvalues import aligned_grouped_m, fast_m_values
from warmd.plan import make_plan


def grouped(plan):
    return [t for t in plan.tasks if t.num_groups]


# (serve command, model directory, equivalent warmd flags)
CASES = [
    ("vllm serve {kimi_k2_instruct} --tensor-parallel-size 8 --data-parallel-size 2 "
     "--enable-expert-parallel --max-num-batched-tokens 16384 --trust-remote-code "
     "--gpu-memory-utilization 0.9",
     "kimi-k2-instruct", dict(tp=8, dp=2, ep=16, max_tokens=16384)),
    ("python3 -m vllm.entrypoints.openai.api_server --model={llama_3_1_8b_instruct_fp8_dynamic}"
     " --tensor_parallel_size=2 --max_num_batched_tokens 4096 --port 8000",
     "llama-3.1-8b-instruct-fp8-dynamic", dict(tp=2, max_tokens=4096)),
    ("vllm serve {mistral_small_3_1_24b_instruct_2503} -tp 4 --max-num-batched-tokens=4096 "
     "--tokenizer-mode mistral --limit-mm-per-prompt '{{\"image\": 4}}'",
     "mistral-small-3.1-24b-instruct-2503", dict(tp=4, max_tokens=4096)),
    ("python -m sglang.launch_server --model-path {qwen3_30b_a3b_fp8} --tp 4 "
     "--moe-a2a-backend deepep --chunked-prefill-size 4096 --mem-fraction-static 0.8",
     "qwen3-30b-a3b-fp8", dict(engine="sglang", tp=4, ep=4, moe_a2a_backend="deepep",
                               chunked_prefill_size=4096)),
    ("vllm serve {llama_3_1_8b_instruct} --tensor-parallel-size 2 --data-parallel-size 2",
     "llama-3.1-8b-instruct", dict(tp=2, dp=2)),
    ("vllm serve {mixtral_8x7b_instruct} --tensor-parallel-size 8 --enable-expert-parallel",
     "mixtral-8x7b-instruct", dict(tp=8, ep=8)),
    ("sglang serve --model-path {qwen3_30b_a3b_fp8} --tp-size 2 --ep-size 2",
     "qwen3-30b-a3b-fp8", dict(engine="sglang", tp=2, ep=2)),
]


@pytest.mark.parametrize("command, name, flags", CASES, ids=[c[1] + "-" + c[0].split()[0]
                                                              for c in CASES])
def test_serve_command_plans_what_the_equivalent_flags_plan(command, name, flags):
    pasted = from_command(command)
    assert pasted.to_json() == from_flags(name, **flags).to_json()
    assert pasted.tasks  # every case warms something


# vLLM >= 0.17.0 runs block-FP8 MoE with expert parallel on FlashInfer CUTLASS by default
# (fused_moe/oracle/fp8.py; tests/engines/test_backends.py); DeepGEMM MoE, whose M sets these tests
# check, is what it runs with VLLM_MOE_USE_DEEP_GEMM=1 set explicitly.
DEEP_GEMM_MOE = (("VLLM_MOE_USE_DEEP_GEMM", "1"),)


def test_kimi_k2_plans_as_deepseek_v3_with_dp_ep():
    plan = from_command(CASES[0][0], engine_env=DEEP_GEMM_MOE)
    assert plan.model.model_type == "deepseek_v3"  # model_type kimi_k2, architecture DSv3
    w13 = selection(plan, "mlp.experts.w13").layer
    assert (w13.num_groups, w13.n, w13.k) == (384 // 16, 2 * 2048, 7168)  # EP = TP x DP
    # The fused_qkv_a_proj (N = 1536 + 512 + 64 = 2112) vLLM's own warmup skips.
    assert any((t.n, t.k) == (2112, 7168) for t in plan.tasks if t.kernel == "fp8_gemm_nt")
    # vLLM >= 0.33.0 (_get_grouped_gemm_params): every DP rank's tokens, no chunk-size cap.
    assert {max(t.m) for t in grouped(plan)} == {aligned_grouped_m(2 * 16384, 8, 24)}
    assert any("DP 2 x 16384" in note for note in plan.engine_notes)
    # Before 0.33.0: compute_aligned_M(min(dp x 16384, VLLM_FUSED_MOE_CHUNK_SIZE 16384), ...).
    old = from_command(CASES[0][0], engine_env=DEEP_GEMM_MOE, engine_version="0.32.0")
    assert {max(t.m) for t in grouped(old)} == {aligned_grouped_m(16384, 8, 24)} == {134144}


def test_vllm_dp_multiplies_grouped_tokens_up_to_the_chunk_size():
    qwen = "vllm serve {qwen3_30b_a3b_fp8} -tp 2 -dp 2 -ep --max-num-batched-tokens 2048"
    plan = from_command(qwen, engine_env=DEEP_GEMM_MOE)
    assert plan.model.ep == 4
    assert {max(t.m) for t in grouped(plan)} == {aligned_grouped_m(4096, 8, 32)}
    dense = [t for t in plan.tasks if t.kernel == "fp8_gemm_nt"]
    assert dense and max(max(t.m) for t in dense) == 2048  # dense GEMMs see one rank's tokens
    capped = from_command(qwen, engine_env=(("VLLM_FUSED_MOE_CHUNK_SIZE", "3000"),
                                            *DEEP_GEMM_MOE), engine_version="0.32.0")
    assert {max(t.m) for t in grouped(capped)} == {aligned_grouped_m(3000, 8, 32)}
    # vLLM 0.33.0 dropped the variable: it caps nothing, and the plan says so.
    newest = from_command(qwen, engine_env=(("VLLM_FUSED_MOE_CHUNK_SIZE", "3000"),
                                            *DEEP_GEMM_MOE))
    assert {max(t.m) for t in grouped(newest)} == {aligned_grouped_m(4096, 8, 32)}
    assert any("VLLM_FUSED_MOE_CHUNK_SIZE is not read" in n for n in newest.engine_notes)


def test_vllm_dp_without_ep_splits_the_experts_over_tp_x_dp():
    # FusedMoEParallelConfig.make: the MoE's TP group is TP x DP without expert parallel.
    plan = from_command("vllm serve {mixtral_8x7b_instruct} -tp 2 -dp 2")
    w2 = selection(plan, "mlp.experts.w2").layer
    assert (w2.num_groups, w2.k) == (8, 14336 // 4)


def test_compressed_tensors_and_fbgemm_fp8(write_config):
    plan = from_command(CASES[1][0])
    qkv = selection(plan, "self_attn.qkv_proj")
    assert qkv.layer.quant == "fp8_tensor" and qkv.kernel.name == "CutlassFP8ScaledMMLinearKernel"
    assert selection(plan, "lm_head").layer.quant == "bf16"  # ignore: [lm_head]
    assert not [t for t in plan.tasks if t.library == "deep_gemm"]
    config = json.loads((MODELS / "llama-3.1-8b-instruct-fp8-dynamic" / "config.json")
                        .read_text())
    weights = config["quantization_config"]["config_groups"]["group_0"]["weights"]
    weights.update(strategy="block", block_structure=[128, 128])
    block = from_flags("llama-3.1-8b-instruct", model=str(write_config(config)))
    assert selection(block, "self_attn.o_proj").kernel.name == \
        "FlashInferFp8DeepGEMMDynamicBlockScaledKernel"  # block FP8: DeepGEMM on Hopper
    assert any(t.kernel == "fp8_gemm_nt" for t in block.tasks)
    config["quantization_config"] = {"quant_method": "fbgemm_fp8",
                                     "modules_to_not_convert": ["lm_head"]}
    fbgemm = from_flags("llama-3.1-8b-instruct", model=str(write_config(config)))
    assert selection(fbgemm, "self_attn.qkv_proj").layer.quant == "fp8_tensor"


def test_multimodal_text_config():
    plan = from_command(CASES[2][0])
    assert plan.model.model_type == "mistral"
    qkv = selection(plan, "self_attn.qkv_proj").layer
    assert (qkv.n, qkv.k) == ((32 // 4 + 2 * 8 // 4) * 128, 5120)
    assert selection(plan, "self_attn.qkv_proj").layer.count == 40


def test_sglang_m_range_follows_its_precompile():
    plan = from_command(CASES[3][0])
    assert plan.mspec.mode == "full" and plan.mspec.max_tokens == 16384  # cps <= 8192
    assert selection(plan, "mlp.experts.w13").kernel.name == "DeepEPDeepGemmExperts"
    masked = [t for t in plan.tasks if t.kernel == "m_grouped_fp8_gemm_nt_masked"]
    assert masked and all(t.m == tuple(range(1, 16385)) for t in masked)
    assert (sglang_m_max(None), sglang_m_max(8192), sglang_m_max(16384), sglang_m_max(-1),
            sglang_m_max(100000)) == (16384, 16384, 32768, 65536, 131072)
    fast = from_command(CASES[3][0].replace("4096", "16384"),
                        engine_env=(("SGLANG_JIT_DEEPGEMM_FAST_WARMUP", "1"),))
    assert fast.mspec.mode == "fast" and fast.mspec.max_tokens == sglang_fast_max(16384)
    # compile_utils.py's own count for a 16384 chunk ("Totally ... = 3072 kernels"): 1024
    # small Ms, four bands of 512 (1024 counted once), and 16384 itself.
    assert len(fast_m_values(16384)) == 3072
    assert any("SGLANG_JIT_DEEPGEMM_FAST_WARMUP=1" in n for n in fast.engine_notes)


def test_sglang_plain_ep_runs_triton_moe():
    plan = from_command(CASES[6][0])
    assert selection(plan, "mlp.experts.w13").kernel.name == "TritonExperts"
    assert not grouped(plan)
    assert any("without --moe-a2a-backend deepep" in n for n in plan.engine_notes)


@pytest.mark.parametrize("variable, value, check", [
    ("VLLM_BLOCKSCALE_FP8_GEMM_FLASHINFER", "0",
     lambda p: selection(p, "self_attn.o_proj").kernel.name == "DeepGemmFp8BlockScaledMMKernel"
     and min(t.m[0] for t in p.tasks if t.kernel == "fp8_gemm_nt") == 1),
    ("VLLM_USE_DEEP_GEMM", "0", lambda p: not [t for t in p.tasks if t.library == "deep_gemm"]),
    ("VLLM_MOE_USE_DEEP_GEMM", "0",
     lambda p: not grouped(p) and any(t.kernel == "fp8_gemm_nt" for t in p.tasks)),
    ("VLLM_USE_FLASHINFER_SAMPLER", "0",
     lambda p: selection(p, "sampler").kernel.name == "TorchSampler"),
    ("VLLM_DEEP_GEMM_WARMUP", "full", lambda p: p.mspec.mode == "full"),
    ("VLLM_ATTENTION_BACKEND", "FLASHINFER_MLA",
     lambda p: selection(p, "self_attn.attn").kernel.name == "FlashInferMLABackend"),
])
def test_engine_variables_change_choices_and_say_so(variable, value, check):
    # vLLM 0.14.0: a release where each of these changes a choice for this TP-only Hopper
    # launch (from 0.17.0 Triton MoE comes first under TP, so VLLM_MOE_USE_DEEP_GEMM=0 changes
    # nothing there; 0.16.0 dropped VLLM_ATTENTION_BACKEND: tests/engines/test_backends.py).
    command = "vllm serve {kimi_k2_instruct} -tp 8 --max-num-batched-tokens 1024"
    plan = from_command(command, engine_env=((variable, value),), engine_version="0.14.0")
    assert check(plan)
    assert any(f"{variable}={value}" in note for note in plan.engine_notes), plan.engine_notes
    reasons = [r.reason for s in plan.selections for r in s.rejected]
    if variable not in ("VLLM_DEEP_GEMM_WARMUP",):
        assert any(variable in r for r in reasons), reasons


def test_deep_gemm_default_follows_the_vllm_version():
    command = "vllm serve {kimi_k2_instruct} -tp 8 --max-num-batched-tokens 1024"
    old = from_command(command, engine_version="0.10.2")
    assert not [t for t in old.tasks if t.library == "deep_gemm"]
    assert any("VLLM_USE_DEEP_GEMM defaults to 0" in n for n in old.engine_notes)
    new = from_command(command, engine_version="0.11.0")
    assert [t for t in new.tasks if t.library == "deep_gemm"]
    assert resolve_version("vllm", "0.11.0rc1+cu128")[0] == (0, 11, 0)
    assert parse_version("v0.9") == (0, 9, 0)
    with pytest.raises(WarmdInputError, match="not a version"):
        parse_version("latest")


def test_bad_engine_variable_is_bad_input():
    with pytest.raises(WarmdInputError, match="VLLM_USE_DEEP_GEMM must be 0 or 1"):
        from_command("vllm serve {kimi_k2_instruct} -tp 8",
                     engine_env=(("VLLM_USE_DEEP_GEMM", "maybe"),))


def test_warmd_yaml_engine_command_and_env():
    from warmd.config.parse import parse_config

    command = (f"vllm serve {model('qwen3-30b-a3b-fp8')} -tp 2 -dp 2 --enable-expert-parallel"
               " --max-num-batched-tokens 2048")
    config = parse_config({"models": [{"name": "q", "engine_command": command, "target": "h200",
                                       "with": ["deep_gemm"],
                                       "env": {"VLLM_FUSED_MOE_CHUNK_SIZE": 3000,
                                               "VLLM_MOE_USE_DEEP_GEMM": 1}}]})
    request = config.models[0].plan_request()
    assert (request.tp, request.dp, request.ep, request.max_tokens) == (2, 2, 4, 2048)
    plan = make_plan(replace(request, engine_version="0.32.0"))  # still read the variable
    assert {max(t.m) for t in grouped(plan)} == {aligned_grouped_m(3000, 8, 32)}
    with pytest.raises(WarmdInputError, match="models\\[0\\].env: unknown engine variable"):
        parse_config({"models": [{"engine_command": command, "env": {"NOPE": "1"}}]})
    with pytest.raises(WarmdInputError, match="engine_command: unknown engine command"):
        parse_config({"models": [{"engine_command": "tgi serve x"}]})


def test_engine_variables_are_read_from_the_process_environment(monkeypatch):
    from warmd.engines.environment import EngineEnv, process_engine_env

    monkeypatch.setenv("VLLM_USE_DEEP_GEMM_E8M0", "False")
    assert EngineEnv.of("vllm", process_engine_env(), None).get("VLLM_USE_DEEP_GEMM_E8M0") is False
    monkeypatch.setenv("VLLM_USE_DEEP_GEMM_E8M0", "1")
    assert EngineEnv.of("vllm", process_engine_env(), None).get("VLLM_USE_DEEP_GEMM_E8M0") is True
    monkeypatch.setenv("VLLM_DISABLED_KERNELS", " A, ,B")
    assert EngineEnv.of("vllm", process_engine_env(), None).get("VLLM_DISABLED_KERNELS") == (
        "A", "B")


@pytest.mark.parametrize("target, expected", [
    ("h200", 8192), ("h100", 8192), ("h20", 8192), ("rtx-pro-6000", 8192),
    ("b200", 16384), ("gb200", 16384), ("b300", 16384), ("a100", 2048), ("l40s", 2048)])
def test_vllm_token_budget_follows_the_gpu_memory(target, expected):
    # vllm/engine/arg_utils.py EngineArgs.get_batch_defaults (vllm serve: OPENAI_API_SERVER).
    plan = from_command("vllm serve {llama_3_1_8b_instruct}", target=target)
    assert plan.mspec.max_tokens == expected
    assert any(f"defaults to {expected} on" in n for n in plan.engine_notes)


def test_vllm_token_budget_modes():
    doubled = from_command("vllm serve {llama_3_1_8b_instruct} --performance-mode throughput",
                           target="b200")
    assert doubled.mspec.max_tokens == 32768
    batched = from_command("vllm serve {qwen3_30b_a3b_fp8} -tp 2 -dp 2 -ep "
                           "--all2all-backend deepep_low_latency")
    assert batched.mspec.max_tokens == 256 and batched.mspec.moe_tokens == 512
    given = from_command("vllm serve {llama_3_1_8b_instruct} --max-num-batched-tokens 4096 "
                         "--performance-mode throughput", target="b200")
    assert given.mspec.max_tokens == 4096  # only the default doubles


@pytest.mark.parametrize("target, chunk, m_max", [
    ("h200", 8192, 16384), ("b200", 16384, 32768), ("l40s", 4096, 16384)])
def test_sglang_chunked_prefill_default_follows_the_gpu_memory(target, chunk, m_max):
    # memory_hook.py _handle_gpu_memory_settings, then compile_utils.py's precompile range.
    plan = from_command("python -m sglang.launch_server --model-path {qwen3_30b_a3b_fp8} "
                        "--tp 2", target=target)
    assert plan.mspec.max_tokens == m_max
    assert any(f"--chunked-prefill-size defaults to {chunk}" in n for n in plan.engine_notes)


def test_vllm_relax_set_follows_the_release_block_sizes():
    from warmd.engines.rules import vllm_relax_block_ms
    from warmd.mvalues import relax_m_values

    # deep_gemm_warmup.py _generate_optimal_warmup_m_values: 0.34.0 walks BLOCK_M 16..256.
    new = relax_m_values(8192, 4096, 132, vllm_relax_block_ms((0, 34, 0)))
    old = relax_m_values(8192, 4096, 132, vllm_relax_block_ms((0, 33, 0)))
    assert set(old) < set(new) and 80 in new and 80 not in old
    command = "vllm serve {kimi_k2_instruct} -tp 8 --max-num-batched-tokens 1024"

    def dense_m(version):
        plan = from_command(command, engine_version=version)
        return {m for t in plan.tasks if t.kernel == "fp8_gemm_nt" for m in t.m}
    assert 80 in dense_m("0.34.0") and 80 not in dense_m("0.33.0")


def test_vllm_warms_the_wrappers_deep_gemm_branch_below_32_too():
    # deep_gemm_warmup.py _deep_gemm_linear_data: the wrapper's DeepGEMM branch stamps itself
    # deep_gemm_warmup_provider, so vLLM >= 0.33.0 compiles it at every M of the set.
    command = "vllm serve {kimi_k2_instruct} -tp 8 --max-num-batched-tokens 1024"
    new = from_command(command)
    assert selection(new, "self_attn.o_proj").kernel.name == \
        "FlashInferFp8DeepGEMMDynamicBlockScaledKernel"
    assert {min(t.m) for t in new.tasks if t.kernel == "fp8_gemm_nt"} == {1}
    old = from_command(command, engine_version="0.32.0")
    assert {min(t.m) for t in old.tasks if t.kernel == "fp8_gemm_nt"} == {32}


def test_drift_reports_each_rule_whose_cited_source_changed():
    from warmd.engines.rules import Rule
    from warmd.engines.sources import SourceTree, drift, rule_digests
    from warmd.engines.versions import VersionRange

    trees = Path(__file__).parents[1] / "data" / "engine_src"
    old, new = SourceTree(trees / "old"), SourceTree(trees / "new")
    assert (old.version(), new.version()) == ("9.9.0", "9.9.1")
    cited = "vllm/warmup/deep_gemm_warmup.py"
    rules = [Rule("m-set", "vllm", VersionRange(), cited, "_generate_optimal_warmup_m_values",
                  "the M set"),
             Rule("wrapper", "vllm", VersionRange(), cited, "_deep_gemm_linear_data", "w"),
             Rule("block", "vllm", VersionRange(), cited, "BLOCK", "a table"),
             Rule("file", "vllm", VersionRange(), "vllm/missing.py", "", "a whole file")]
    followed = rule_digests(old, rules)
    assert followed["file"] is None and all(followed[r] for r in ("m-set", "wrapper", "block"))
    found = {rule.id: what for rule, what in drift(followed, new, rules)}
    # A comment or the layout is not a change; the code and a removed table are.
    assert found == {"m-set": "changed", "block": "absent"}
    assert drift(followed, old, rules) == []


def test_every_rule_has_a_digest_of_the_followed_release_and_a_row_in_the_docs():
    from warmd.engines.cli_args import FOLLOWED
    from warmd.engines.rules import RULES
    from warmd.engines.sources import DIGESTS

    stored = json.loads(DIGESTS.read_text())
    docs = (Path(__file__).parents[2] / "docs" / "selection.md").read_text()
    for rule in RULES:
        assert stored[rule.engine]["version"] == FOLLOWED[rule.engine]
        assert stored[rule.engine]["digests"].get(rule.id), rule.id
        assert f"`{rule.id}`" in docs, rule.id


def test_engine_variables_are_knobs_of_the_one_table():
    from warmd import knobs
    from warmd.engines.environment import ALIASES, BY_NAME

    assert set(knobs.ENGINE_KERNEL_ENV) == set(BY_NAME) | set(ALIASES)
    assert set(knobs.ENGINE_KERNEL_ENV) <= {knob.env for knob in knobs.KNOBS}


def test_linear_backend_keeps_its_kernels_where_it_has_some():
    # kernels/linear/__init__.py _resolve_backend_kernels + _LINEAR_BACKEND_KERNEL_MAP.
    command = "vllm serve {qwen3_30b_a3b_fp8} -tp 2 --linear-backend deep_gemm"
    plan = from_command(command)
    reasons = picked(plan, "self_attn.qkv_proj", "DeepGemmFp8BlockScaledMMKernel")
    assert "--linear-backend deep_gemm selects" in \
        reasons["FlashInferFp8DeepGEMMDynamicBlockScaledKernel"]
    assert not any("not modelled" in n for n in plan.engine_notes)
    wrapper = from_command(command.replace("deep_gemm", "flashinfer_cutlass"))
    assert selection(wrapper, "self_attn.qkv_proj").kernel.name == \
        "FlashInferFp8DeepGEMMDynamicBlockScaledKernel"  # its branches stay
    # A backend with no kernel for the layer type: vLLM keeps its automatic choice.
    other = from_command(command.replace("deep_gemm", "humming"))
    assert selection(other, "self_attn.qkv_proj").kernel.name == \
        "FlashInferFp8DeepGEMMDynamicBlockScaledKernel"
    assert any("vLLM keeps its automatic choice" in n for n in other.engine_notes)


def test_router_gemm_is_named_as_left_to_the_engine():
    # kernel_warmup.py _warmup_ll_bf16_router_gemm: every bf16 gate with K % 8, sm90 and
    # later, whatever the router computes in; 0.33.0 has it too, 0.32.0 does not.
    from warmd.plan import engine_jit

    libs = ("deep_gemm", "flashinfer", "nvcc", "cutlass_dsl")
    plan = from_command("vllm serve {qwen3_30b_a3b_fp8} -tp 2", with_libs=libs)
    [line] = engine_jit(selection(plan, "mlp.gate"), plan.env, plan.mspec)
    assert line.startswith("CuTe-DSL router GEMM (ll_bf16, K=2048, N=128, M 1..16")
    for version, named in (("0.33.0", True), ("0.32.0", False)):
        old = from_command("vllm serve {qwen3_30b_a3b_fp8} -tp 2", engine_version=version,
                           with_libs=libs)
        assert bool(engine_jit(selection(old, "mlp.gate"), old.env, old.mspec)) is named
    sglang = from_command("python -m sglang.launch_server --model-path {qwen3_30b_a3b_fp8} "
                          "--tp 2", with_libs=libs)
    assert engine_jit(selection(sglang, "mlp.gate"), sglang.env, sglang.mspec) == []


def test_sglang_dp_attention_stays_named_as_not_modelled():
    plan = from_command("python -m sglang.launch_server --model-path {qwen3_30b_a3b_fp8} "
                        "--tp 2 --enable-dp-attention --dp 2 --fp8-gemm-backend triton")
    note = next(n for n in plan.engine_notes if n.startswith("not modelled"))
    assert "--enable-dp-attention" in note and "--fp8-gemm-backend" not in note


def test_sglang_fp8_gemm_backend_triton_has_no_deep_gemm_linear_tasks():
    # fp8_utils.py _dispatch_explicit_backend: triton -> triton_w8a8_block_fp8_linear.
    command = "python -m sglang.launch_server --model-path {qwen3_30b_a3b_fp8} --tp 2"
    auto = from_command(command)
    assert any(t.kernel == "fp8_gemm_nt" for t in auto.tasks)
    triton = from_command(command + " --fp8-gemm-backend triton")
    assert not any(t.kernel == "fp8_gemm_nt" for t in triton.tasks)
    qkv = selection(triton, "self_attn.qkv_proj")
    assert qkv.kernel.name == "TritonFp8BlockScaledMMKernel"
    assert any("--fp8-gemm-backend triton selects" in r.reason for r in qkv.rejected)
    # the MoE keeps its runner: the flag is about linear layers
    assert selection(triton, "mlp.experts.w13").kernel.name == \
        selection(auto, "mlp.experts.w13").kernel.name
