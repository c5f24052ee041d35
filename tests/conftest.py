import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "default",
    max_examples=int(os.environ.get("SPECKV_HYPOTHESIS_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("default")


@pytest.fixture(scope="session")
def cuda_host(tmp_path_factory):
    """``cuda/host_shim.cpp``: the CUDA module's sources built for the host (C ABI, ctypes),
    so the CPU tests run the kernels' very code. Skips without a C++ compiler."""
    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler to build cuda/host_shim.cpp for the host")
    root = Path(__file__).resolve().parent.parent
    out = tmp_path_factory.mktemp("cuda") / "libspeckv_params.so"
    cmd = [cxx, "-O2", "-std=c++17", "-ffp-contract=off", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC"]
    subprocess.run([*cmd, str(root / "cuda" / "host_shim.cpp"), "-o", str(out)], check=True)
    lib = ctypes.CDLL(str(out))
    size, pointer = ctypes.c_size_t, ctypes.c_void_p
    lib.speckv_sigma_codes.argtypes = [pointer, pointer, size]
    lib.speckv_relative_sigma_codes.argtypes = [pointer] * 4 + [size, size]
    lib.speckv_fp8_quantize.argtypes = [pointer, ctypes.c_float, pointer, size]
    lib.speckv_coding_mu.argtypes = [pointer, ctypes.c_float, ctypes.c_int, pointer, pointer, size]
    lib.speckv_xxh3.argtypes = [pointer, size, pointer, size]
    lib.speckv_xxh3.restype = ctypes.c_uint64
    return lib
