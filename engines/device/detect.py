"""What this machine offers for the codec engines: accelerator, driver and library versions.

`detect_platform(device)` returns a flat JSON-able dict that the build manifest records and that
`engines.codec.build` compares against at load time. Every probe is guarded: a missing or broken library
shows up as None, never as an exception.
"""
from __future__ import annotations

import ctypes
import logging
import math
import os
import platform
import shutil
import subprocess
from pathlib import Path

import torch

from engines.names import ALL, is_multi

log = logging.getLogger(__name__)


def resolve_device(device: str | None = "auto") -> str:
    """'auto' -> 'cuda' if a CUDA GPU is visible, else 'npu' if torch_npu sees one, else 'cpu'.
    A value naming several engines ('all', 'cuda:0,cuda:1') gives its first device: what commands
    that run one engine (`say`, `work`, `build-engines`) use."""
    if is_multi(device):
        return resolve_devices(device)[0]
    if device and device != "auto":
        return str(device)
    if torch.cuda.is_available():
        return "cuda"
    from engines.device.npu import npu_available

    return "npu" if npu_available() else "cpu"


def resolve_devices(device: str | None = "auto") -> list[str]:
    """The device of each engine the daemon runs for a model.device value: 'all' -> every CUDA GPU
    ('cuda:0', 'cuda:1', ...), else every Ascend NPU, else ['cpu']; a comma list -> its items in order
    (the same device may repeat: 'cpu,cpu' runs two CPU engines); anything else -> [resolve_device()]."""
    spec = str(device or "auto").strip()
    if spec == ALL:
        if torch.cuda.is_available():
            return [f"cuda:{i}" for i in range(torch.cuda.device_count())]
        from engines.device.npu import import_torch_npu, npu_available

        if npu_available():
            return [f"npu:{i}" for i in range(import_torch_npu().npu.device_count())]
        return ["cpu"]
    if "," in spec:
        return [x.strip() for x in spec.split(",") if x.strip()]
    return [resolve_device(spec)]


def device_missing(device: str) -> str | None:
    """Why `device` (cpu, cuda[:N], npu[:N], as resolve_devices gives them) is not on this machine, in words for
    an admin; None when it is there. A device that is not there is a setting to change, not a failure to retry."""
    kind, _, index = str(device).partition(":")
    if kind == "cpu":
        return None
    if kind == "cuda":
        if not torch.cuda.is_available():
            build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
            return f"no CUDA GPU is visible here (torch {torch.__version__} is {build}; nvidia-smi lists the GPUs)"
        count = torch.cuda.device_count()
    elif kind == "npu":
        from engines.device.npu import import_torch_npu, npu_available

        if not npu_available():
            return "no Ascend NPU is visible here (torch_npu is not installed, or no NPU answers; npu-smi info lists them)"
        count = import_torch_npu().npu.device_count()
    else:
        return f"{kind!r} is not a device kind this appliance runs on (cpu, cuda, npu)"
    if index.isdigit() and int(index) >= count:
        return f"{device} does not exist: this machine has {count} ({kind}:0 to {kind}:{count - 1})"
    return None


def _version(module: str) -> str | None:
    try:
        mod = __import__(module)
    except Exception as exc:  # ImportError, or a shared-library load error
        log.debug("%s not importable: %s", module, exc)
        return None
    return str(getattr(mod, "__version__", "?"))


def ort_providers() -> list[str]:
    try:
        import onnxruntime
    except Exception:
        return []
    return list(onnxruntime.get_available_providers())


def cpu_cores() -> int:
    """Physical cores this process may run on: the CPUs of its affinity mask, SMT siblings counted once
    (sysfs topology), at most its cgroup's CPU quota (v2 cpu.max, v1 cpu.cfs_quota_us); at least 1."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = list(range(os.cpu_count() or 1))
    cores = set()
    for c in cpus:
        topo = Path(f"/sys/devices/system/cpu/cpu{c}/topology")
        try:
            cores.add(((topo / "physical_package_id").read_text().strip(), (topo / "core_id").read_text().strip()))
        except OSError:  # no sysfs topology: count the CPU itself
            cores.add(("cpu", str(c)))
    quota = _cgroup_cpu_quota()
    return max(1, min(len(cores), math.ceil(quota)) if quota else len(cores))


def _cgroup_cpu_quota(proc: Path = Path("/proc/self/cgroup"), fs: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPUs' worth of time this process's cgroup may use; None without a limit (or when unknown)."""
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, group = line.split(":", 2)
        try:
            if controllers == "":  # cgroup v2: "max 100000" or "200000 100000"
                quota, period = (fs / group.lstrip("/") / "cpu.max").read_text().split()
                if quota != "max":
                    return int(quota) / int(period)
            elif "cpu" in controllers.split(","):  # cgroup v1: quota -1 means none
                d = fs / controllers / group.lstrip("/")
                quota = int((d / "cpu.cfs_quota_us").read_text())
                if quota > 0:
                    return quota / int((d / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
    return None


def _cpuinfo(*keys: str) -> str | None:
    """The value of the first /proc/cpuinfo line that starts with one of `keys`; None where there is none."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith(keys):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_name() -> str:
    return _cpuinfo("model name") or platform.processor() or platform.machine()


SIMD_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni", "avx512_bf16",
              "amx_bf16", "amx_int8", "asimd", "asimddp", "bf16", "i8mm")  # what the CPU kernels care about


def cpu_flags() -> frozenset:
    """The CPU's feature flags as /proc/cpuinfo names them (x86 `flags`, Arm `Features`); empty where unknown."""
    return frozenset((_cpuinfo("flags", "Features") or "").split())


def simd_summary() -> str:
    """The instruction sets the CPU kernels care about, present on this CPU (benchmarks print it)."""
    flags = cpu_flags()
    return " ".join(f for f in SIMD_FLAGS if f in flags) or "unknown"


def nvidia_driver() -> str | None:
    """The NVIDIA driver release (e.g. '550.54.15') from nvidia-smi, else the CUDA driver API version."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip().splitlines()[0].strip()
        except (OSError, subprocess.SubprocessError) as exc:
            log.debug("nvidia-smi failed: %s", exc)
    try:
        lib, v = ctypes.CDLL("libcuda.so.1"), ctypes.c_int()
        if lib.cuDriverGetVersion(ctypes.byref(v)) == 0:
            return f"cuda-api-{v.value // 1000}.{v.value % 1000 // 10}"
    except OSError:
        pass
    return None


def detect_platform(device: str = "auto") -> dict:
    """Accelerator and library facts for `device` ('auto', 'cpu', 'cuda[:N]', 'npu[:N]')."""
    dev = resolve_device(device)
    info = {"device": dev.split(":")[0], "device_name": None, "capability": None, "driver": None,
            "cpu": cpu_name(), "cpu_count": os.cpu_count(), "machine": platform.machine(),
            "python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "onnx": _version("onnx"), "onnxruntime": _version("onnxruntime"), "ort_providers": ort_providers(),
            "tensorrt": _version("tensorrt"), "triton": _version("triton"), "torch_npu": None}
    if info["device"] == "cuda":
        idx = torch.device(dev).index or 0
        info["device_name"] = torch.cuda.get_device_name(idx)
        info["capability"] = "%d.%d" % torch.cuda.get_device_capability(idx)
        info["driver"] = nvidia_driver()
    elif info["device"] == "npu":
        from engines.device.npu import npu_info

        npu = npu_info()
        info["device_name"], info["torch_npu"] = npu.get("device_name"), npu.get("torch_npu")
    else:
        info["device_name"] = info["cpu"]
    return info


def gpu_list() -> list[dict]:
    """Every visible CUDA GPU: index, name, compute capability, total and free memory (GiB)."""
    out = []
    if not torch.cuda.is_available():
        return out
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        gpu = {"device": f"cuda:{i}", "name": props.name, "capability": f"{props.major}.{props.minor}",
               "memory_gib": round(props.total_memory / 2**30, 1), "free_gib": None}
        try:
            gpu["free_gib"] = round(torch.cuda.mem_get_info(i)[0] / 2**30, 1)
        except RuntimeError as exc:  # a GPU in exclusive mode held by another process
            log.debug("free memory of cuda:%d unknown: %s", i, exc)
        out.append(gpu)
    return out


def device_inventory() -> dict:
    """What a bug report needs about this machine's compute: library versions, every GPU, the NPU,
    the CPU (cores in total and usable by this process) and torch's thread count. Never raises."""
    from engines.device.npu import npu_info

    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count()
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": cudnn,
            "cuda_available": torch.cuda.is_available(), "driver": None, "gpus": [], "npu": npu_info() or None,
            "cpu": cpu_name(), "cpu_cores": os.cpu_count(), "cpu_cores_usable": usable,
            "torch_threads": torch.get_num_threads(), "machine": platform.machine(),
            "python": platform.python_version()}
    try:
        info["gpus"] = gpu_list()
    except Exception as exc:  # a broken driver: report it, do not fail the report
        info["gpus_error"] = str(exc)
    if info["cuda_available"] or shutil.which("nvidia-smi"):
        info["driver"] = nvidia_driver()
    return info
