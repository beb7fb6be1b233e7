"""What the installed llama.cpp was built with, and how much memory its devices have.

Everything comes from llama.cpp / ggml themselves (ctypes over the libraries llama-cpp-python
ships): ``llama_supports_gpu_offload``, ``llama_print_system_info``, and ggml's backend device
registry (``ggml_backend_dev_*`` in libggml: name, description, type, free/total memory). The
CPU's RAM comes from ``/proc/meminfo`` (MemAvailable) where it exists, else from ggml's CPU device.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import llama_cpp

# enum ggml_backend_dev_type
DEV_CPU, DEV_GPU, DEV_IGPU, DEV_ACCEL = 0, 1, 2, 3
_KIND = {DEV_CPU: "cpu", DEV_GPU: "gpu", DEV_IGPU: "igpu", DEV_ACCEL: "accel"}


@dataclass(frozen=True)
class Device:
    name: str          # ggml's name: "CPU", "CUDA0", "MTL0", "Vulkan0", ...
    description: str
    kind: str          # "cpu", "gpu", "igpu" (integrated / unified memory) or "accel"
    free_bytes: int
    total_bytes: int

    @property
    def is_gpu(self) -> bool:
        return self.kind in ("gpu", "igpu")


@dataclass(frozen=True)
class BackendInfo:
    gpu_offload: bool                  # llama_supports_gpu_offload()
    system_info: str                   # llama_print_system_info(): "CPU : AVX2 = 1 | ... | CUDA : ..."
    devices: tuple[Device, ...]        # every device ggml sees, CPU included
    cpu_features: dict[str, bool] = field(default_factory=dict)

    @property
    def gpus(self) -> tuple[Device, ...]:
        return tuple(d for d in self.devices if d.is_gpu)

    @property
    def built_with(self) -> list[str]:
        """Backend names from the build, e.g. ["CPU"], ["CPU", "CUDA"], ["CPU", "Metal"]."""
        names = ["CPU"]
        for dev in self.devices:
            base = dev.name.rstrip("0123456789")
            base = {"MTL": "Metal"}.get(base, base)
            if dev.kind != "cpu" and base not in names:
                names.append(base)
        for part in self.system_info.split("|"):
            label = part.split(":")[0].strip()
            if label.isupper() and label in ("CUDA", "METAL", "VULKAN", "ROCM", "HIP", "SYCL") and label.title() not in names:
                names.append({"METAL": "Metal", "VULKAN": "Vulkan", "ROCM": "ROCm"}.get(label, label))
        return names


def _lib_dir() -> Path:
    return Path(llama_cpp.__file__).parent / "lib"


def _load(stem: str) -> ctypes.CDLL | None:
    for pattern in (f"lib{stem}.so", f"lib{stem}.dylib", f"{stem}.dll", f"lib{stem}.*"):
        for candidate in sorted(_lib_dir().glob(pattern)):
            try:
                return ctypes.CDLL(str(candidate))
            except OSError:
                continue
    return None


def _ggml() -> ctypes.CDLL | None:
    lib = _load("ggml")
    if lib is None:
        return None
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    try:
        lib.ggml_backend_dev_count.restype = sz
        lib.ggml_backend_dev_count.argtypes = []
        lib.ggml_backend_dev_get.restype = vp
        lib.ggml_backend_dev_get.argtypes = [sz]
        for fn in ("ggml_backend_dev_name", "ggml_backend_dev_description"):
            getattr(lib, fn).restype = ctypes.c_char_p
            getattr(lib, fn).argtypes = [vp]
        lib.ggml_backend_dev_type.restype = ctypes.c_int
        lib.ggml_backend_dev_type.argtypes = [vp]
        lib.ggml_backend_dev_memory.restype = None
        lib.ggml_backend_dev_memory.argtypes = [vp, ctypes.POINTER(sz), ctypes.POINTER(sz)]
    except AttributeError:
        return None
    return lib


def _cpu_features() -> dict[str, bool]:
    lib = _load("ggml-cpu")
    out: dict[str, bool] = {}
    if lib is None:
        return out
    for feature in ("avx2", "avx512", "neon", "dotprod", "matmul_int8", "sve"):
        fn = getattr(lib, f"ggml_cpu_has_{feature}", None)
        if fn is not None:
            fn.restype = ctypes.c_int
            out[feature] = bool(fn())
    return out


def meminfo() -> tuple[int, int] | None:
    """(available, total) bytes of RAM from /proc/meminfo, or None where there is none."""
    try:
        fields = {}
        with open("/proc/meminfo") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                fields[key] = int(rest.split()[0]) * 1024
        return fields["MemAvailable"], fields["MemTotal"]
    except (OSError, KeyError, ValueError, IndexError):
        return None


def _ram_fallback() -> tuple[int, int]:
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        total = 0
    return total // 2, total  # no portable "available": assume half


def detect(refresh: bool = False) -> BackendInfo:
    """The build's backends and every device's memory now (free memory changes: ``refresh``)."""
    if refresh:
        _detect.cache_clear()
    return _detect()


@lru_cache(maxsize=1)
def _detect() -> BackendInfo:
    from .process import init_backend

    init_backend()  # registers the backends, routes llama.cpp's log through our callback
    raw = llama_cpp.llama_print_system_info()
    system_info = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    devices: list[Device] = []
    lib = _ggml()
    if lib is not None:
        for i in range(int(lib.ggml_backend_dev_count())):
            dev = lib.ggml_backend_dev_get(i)
            if not dev:
                continue
            free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
            lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
            kind = _KIND.get(int(lib.ggml_backend_dev_type(dev)), "accel")
            name = (lib.ggml_backend_dev_name(dev) or b"?").decode("utf-8", "replace")
            desc = (lib.ggml_backend_dev_description(dev) or b"").decode("utf-8", "replace")
            devices.append(Device(name, desc, kind, int(free.value), int(total.value)))
    ram = meminfo() or _ram_fallback()
    cpu = next((d for d in devices if d.kind == "cpu"), None)
    cpu_dev = Device("CPU", cpu.description if cpu else "CPU", "cpu", ram[0], ram[1])
    devices = [cpu_dev] + [d for d in devices if d.kind != "cpu"]
    return BackendInfo(bool(llama_cpp.llama_supports_gpu_offload()), system_info.strip(), tuple(devices),
                       _cpu_features())
