"""GPU targets: detected from the local machine or named presets for planning anywhere."""

from __future__ import annotations

import glob
import sys
from dataclasses import asdict, dataclass, replace
from functools import cache
from types import EllipsisType

from warmd import settings
from warmd.errors import WarmdInputError


@dataclass(frozen=True)
class Target:
    """One GPU kind that a plan is made for."""

    name: str
    capability: tuple[int, int]
    sms: int
    count: int = 1
    driver: str | None = None
    cuda: str | None = None
    source: str = "preset"
    # Total memory of one GPU in MiB as the driver reports it; engines size their token
    # budgets by it (vLLM's get_batch_defaults, SGLang's _handle_gpu_memory_settings).
    # None: unknown (a custom --capability/--sms target).
    memory_mib: int | None = None

    @property
    def arch(self) -> str:
        return arch_with_suffix(self.capability)

    @property
    def sm(self) -> int:
        return self.capability[0] * 10 + self.capability[1]

    @property
    def is_hopper(self) -> bool:
        return self.capability[0] == 9

    @property
    def is_blackwell(self) -> bool:
        return self.capability[0] in (10, 11, 12)

    def to_json(self) -> dict:
        data = asdict(self)
        data["capability"] = f"{self.capability[0]}.{self.capability[1]}"
        data["arch"] = self.arch
        return data


def arch_with_suffix(capability: tuple[int, int]) -> str:
    """The arch string nvcc and the JIT libraries use: 9.0a, 10.0a, 12.0f, 8.9."""
    major, minor = capability
    if major in (9, 10, 11):
        # Arch-specific features (wgmma, tcgen05) need the 'a' variants.
        return f"{major}.{minor}a"
    if major >= 12:
        # Consumer/workstation Blackwell: family-portable 'f' builds.
        return f"{major}.{minor}f"
    return f"{major}.{minor}"


def _preset(name: str, capability: tuple[int, int], sms: int, memory_mib: int) -> Target:
    return Target(name, capability, sms, memory_mib=memory_mib)


PRESETS: dict[str, Target] = {
    "a100": _preset("NVIDIA A100", (8, 0), 108, 81920),
    "l40s": _preset("NVIDIA L40S", (8, 9), 142, 46068),
    "h100": _preset("NVIDIA H100 80GB HBM3", (9, 0), 132, 81559),
    "h200": _preset("NVIDIA H200", (9, 0), 132, 143771),
    "h20": _preset("NVIDIA H20", (9, 0), 78, 97871),
    "b200": _preset("NVIDIA B200", (10, 0), 148, 183359),
    "gb200": _preset("NVIDIA GB200", (10, 0), 152, 189471),
    "b300": _preset("NVIDIA B300", (10, 3), 148, 275040),
    "rtx-pro-6000": _preset("NVIDIA RTX PRO 6000 Blackwell", (12, 0), 188, 97887),
}


def parse_capability(text: str) -> tuple[int, int]:
    """'9.0', '9.0a', '90', 'sm_90a' -> (9, 0)."""
    raw = text.strip().lower().removeprefix("sm_").removeprefix("sm").rstrip("af")
    try:
        if "." in raw:
            major, minor = raw.split(".", 1)
            return int(major), int(minor)
        value = int(raw)
    except ValueError:
        raise WarmdInputError(
            f"invalid compute capability {text!r}; expected e.g. 9.0 or 10.0") from None
    return value // 10, value % 10


def preset(name: str) -> Target:
    try:
        return PRESETS[name.lower()]
    except KeyError:
        known = ", ".join(sorted(PRESETS))
        raise WarmdInputError(f"unknown target preset {name!r}; known presets: {known}") from None


# visible GPUs: a node's CUDA_VISIBLE_DEVICES ids (None: every GPU), or this process's
Visible = tuple[str, ...] | None | EllipsisType
PROCESS_VISIBLE = ...  # the GPUs this process's environment makes visible


def resolve_target(
    name: str | None = None, capability: str | None = None, sms: int | None = None,
    visible: Visible = PROCESS_VISIBLE,
) -> Target:
    """The target a command plans for: a preset, an explicit capability, or the local GPU
    (of those ``visible``).

    --capability/--sms with a preset may only repeat the preset's own values: a preset
    names one GPU, so 'h200 with sm_8.0' or 'h200 with 10 SMs' is a contradiction, refused
    (a custom GPU is --capability with --sms and no --target)."""
    if sms is not None and sms < 1:
        raise WarmdInputError(f"--sms must be a positive integer, got {sms}")
    cap = parse_capability(capability) if capability is not None else None
    if name and name.lower() == "local":
        if cap is not None or sms is not None:
            raise WarmdInputError("--target local takes the local GPU's capability and SMs; "
                                  "drop --capability/--sms")
        return local_target(visible)
    if name:
        return _check_preset_flags(name, preset(name), cap, sms)
    if cap is not None:
        if sms is None:
            raise WarmdInputError("--capability needs --sms (or a --target preset to take it from)")
        return Target(f"custom sm_{cap[0]}{cap[1]}", cap, sms, source="flags")
    if sms is not None:
        raise WarmdInputError("--sms needs --capability (or a --target preset)")
    return local_target(visible)


def _check_preset_flags(name: str, found: Target, cap: tuple[int, int] | None,
                        sms: int | None) -> Target:
    if cap is not None and cap != found.capability:
        raise WarmdInputError(
            f"--target {name} is sm_{found.capability[0]}{found.capability[1]}, not "
            f"--capability {cap[0]}.{cap[1]}; for another GPU give --capability and --sms "
            "without --target")
    if sms is not None and sms != found.sms:
        raise WarmdInputError(
            f"--target {name} has {found.sms} SMs, not --sms {sms}; for another GPU give "
            "--capability and --sms without --target")
    return found


def local_target(visible: Visible = PROCESS_VISIBLE) -> Target:
    """The first kind of GPU of this machine; bad input (one line) when it has none."""
    local = detect_local_gpus() if visible is PROCESS_VISIBLE else detect_local_gpus(visible)
    if not local:
        known = ", ".join(sorted(PRESETS))
        raise WarmdInputError(
            f"no local GPU found; plan for one with --target ({known}) or --capability/--sms"
        )
    return local[0]


def detect_local_gpus(visible: Visible = PROCESS_VISIBLE) -> tuple[Target, ...]:
    """GPUs of this machine (those visible: a node's ids, else this process's
    CUDA_VISIBLE_DEVICES), one Target per distinct kind with its count; empty without a
    GPU."""
    return _detect(settings.visible_gpu_ids() if visible is PROCESS_VISIBLE else visible)


@cache
def _detect(visible: tuple[str, ...] | None) -> tuple[Target, ...]:
    gpus = _detect_with_nvml(visible)
    if gpus is None:
        gpus = _detect_with_torch()
    return tuple(gpus or ())


def _visible_indices(total: int, visible: tuple[str, ...] | None) -> list[int]:
    if visible is None:
        return list(range(total))
    return [int(part) for part in visible if part.isdigit() and int(part) < total]


def _group(found: list[Target]) -> list[Target]:
    grouped: dict[tuple, Target] = {}
    for gpu in found:
        key = (gpu.name, gpu.capability, gpu.sms)
        prior = grouped.get(key)
        grouped[key] = gpu if prior is None else replace(gpu, count=prior.count + 1)
    return list(grouped.values())


def _detect_with_nvml(visible: tuple[str, ...] | None) -> list[Target] | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError: no driver on this machine
        return None
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        cuda_int = pynvml.nvmlSystemGetCudaDriverVersion_v2()
        cuda = f"{cuda_int // 1000}.{(cuda_int % 1000) // 10}"
        found = []
        for index in _visible_indices(pynvml.nvmlDeviceGetCount(), visible):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            cap = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            sms = _nvml_sm_count(pynvml, handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total // 2**20
            found.append(
                Target(_text(pynvml.nvmlDeviceGetName(handle)), tuple(cap), sms, 1, driver, cuda,
                       "nvml", memory)
            )
        return _group(found) if found else None
    finally:
        pynvml.nvmlShutdown()


def _nvml_sm_count(pynvml, handle) -> int:
    # NVML reports no SM count; take it from the preset of the same GPU (longest name match).
    name = _text(pynvml.nvmlDeviceGetName(handle)).lower()
    matches = [t for t in PRESETS.values() if t.name.lower() in name]
    if matches:
        return max(matches, key=lambda t: len(t.name)).sms
    return 0


def _detect_with_torch() -> list[Target] | None:
    if sys.platform.startswith("linux") and not glob.glob("/dev/nvidia[0-9]*"):
        return None  # no GPU device node: CUDA can see none, so do not pay for torch
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    found = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        found.append(
            Target(props.name, (props.major, props.minor), props.multi_processor_count, 1, None,
                   torch.version.cuda, "torch", props.total_memory // 2**20)
        )
    return _group(found)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
