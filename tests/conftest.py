import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

import speckv.cuda

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
    cmd = [cxx, "-O2", "-std=c++17", "-ffp-contract=off", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-pthread"]
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


class HostModule:
    """``speckv.cuda._Module`` with the host build of the kernels: ``launch`` calls
    ``host_<kernel>`` of ``cuda/host_shim.cpp`` (the kernels' per-item code in a loop) with the
    arguments ``speckv.cuda.encode`` gives the GPU, so the tests drive encode's own steps."""

    def __init__(self, lib):
        p, u64, u32, tables = ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_uint, speckv.cuda.ExactTables
        f32, i32 = ctypes.c_float, ctypes.c_int
        self.signatures = {
            "speckv_sigma_codes": [p, p, u64],
            "speckv_relative_sigma_codes": [p, p, p, p, u64, u64],
            "speckv_fp8_quantize": [p, f32, p, u64],
            "speckv_coding_mu": [p, f32, i32, p, u64, p, u64],
            "speckv_joint_params": [speckv.cuda.JointModel, p, p, p, p, p, p, u64],
            "speckv_exact_symbols": [tables, p, p, p, p, u64],
            "speckv_escapes": [tables, p, p, p, p, u64],
            "speckv_code_lanes": [tables, p, p, p, u64, u64, p, u32, p, u32, p, u64],
            "speckv_payload_lengths": [p, p, u64],
            "speckv_fingerprints": [p, p, u64, u64, p, u64],
            "speckv_join_lanes": [p, u32, p, p, p, u64],
            "speckv_channel_sums": [p, p, p, p, ctypes.c_double, u64, u64, u64, u64, u64, p, u64],
        }
        assert set(self.signatures) == {k for kernels in speckv.cuda.PROGRAMS.values() for k in kernels}
        self.lib, self.tables, self.launches = lib, {}, []

    def launch(self, name, n, args, stream, block=speckv.cuda.BLOCK):
        kernel = getattr(self.lib, f"host_{name}")
        kernel.argtypes = kinds = self.signatures[name]
        assert len(args) == len(kinds), name
        # The driver reads each parameter's bytes from its array, as the kernel declares it
        # (test_the_host_signatures_are_the_kernels_parameters): a wrong width or a float's
        # bits given as an integer would be read wrongly there, so they fail here too.
        for i, (k, a) in enumerate(zip(kinds, args)):
            assert a.nbytes == ctypes.sizeof(k), (
                f"{name} parameter {i}: {a.nbytes} bytes, the kernel reads {ctypes.sizeof(k)}"
            )
            if k in (ctypes.c_float, ctypes.c_double):
                assert a.dtype.kind == "f", f"{name} parameter {i}: a float given as {a.dtype}"
        structs = (speckv.cuda.ExactTables, speckv.cuda.JointModel)
        values = [k.from_buffer_copy(a.tobytes()) if k in structs else a.item() for k, a in zip(kinds, args)]
        self.launches.append((name, n, block))
        kernel(*values)


@pytest.fixture
def host_gpu(cuda_host, monkeypatch):
    """`speckv.cuda.encode` on CPU tensors, its kernels run by the host build."""
    module = HostModule(cuda_host)
    monkeypatch.setattr(speckv.cuda, "_module", lambda tensor: (module, 0))
    return module
