"""The CUDA module's kernels run on the host: a stand-in for ``cuda.bindings.driver`` and a
``speckv.cuda.module._Module`` over it, for ``conftest.host_gpu`` (imported there only when a test
asks for it: this module needs torch, the core's tests do not)."""

from __future__ import annotations

import ctypes
import threading

import speckv.cuda


class HostDriver:
    """``cuda.bindings.driver`` as ``speckv.cuda.module._Module.launch`` calls it, running kernels on
    the host build: ``cuLaunchKernel`` reads ``kernelParams`` as the CUDA driver does (an array
    of pointers, each to one parameter's bytes, as many as the compiled kernel declares:
    ``test_the_host_signatures_are_the_kernels_parameters``) and calls ``host_<kernel>`` of
    ``cuda/host_shim.cpp`` (the kernel's per-item code in a loop) with those values."""

    CONTEXT = 0x5BEC  # the device's primary context (a handle, as the driver's are)

    def __init__(self, lib, signatures):
        self.lib, self.signatures = lib, signatures
        self.current = threading.local()  # each thread's current context, as in the driver

    def CUstream(self, stream):
        return stream

    def cuCtxGetCurrent(self):
        return (0, getattr(self.current, "context", 0))

    def cuCtxSetCurrent(self, context):
        self.current.context = int(context)
        return (0,)

    def cuLaunchKernel(self, name, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        assert self.cuCtxGetCurrent()[1] == self.CONTEXT, f"{name}: launched with no current context"
        assert (gy, gz, by, bz, shared, extra) == (1, 1, 1, 1, 0, 0), name
        assert 1 <= gx <= speckv.cuda.MAX_BLOCKS and 1 <= bx <= 1024, (name, gx, bx)
        kinds = self.signatures[name]
        pointers = (ctypes.c_void_p * len(kinds)).from_address(params)
        values = [k.from_buffer_copy(ctypes.string_at(p, ctypes.sizeof(k))) for k, p in zip(kinds, pointers)]
        kernel = getattr(self.lib, f"host_{name}")
        kernel.argtypes = kinds
        kernel(*values)
        return (0,)  # CUDA_SUCCESS


class HostModule(speckv.cuda.module._Module):
    """``speckv.cuda.module._Module`` with the host build of the kernels behind a ``HostDriver``: the
    tests drive ``speckv.cuda``'s own steps and its own ``launch`` (arguments packed as the
    driver takes them) down to the CUDA driver's interface."""

    def __init__(self, lib):  # no GPU: nothing of _Module's loading
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
            "speckv_fingerprint_blocks": [p, p, u64, u64, u64, p, u64],
            "speckv_fingerprints": [p, p, u64, u64, u64, p, p, u64],
            "speckv_join_lanes": [p, u32, p, p, p, u64],
            "speckv_channel_sums": [p, p, p, p, ctypes.c_double, u64, u64, u64, u64, u64, p, u64],
        }
        assert set(self.signatures) == {k for kernels in speckv.cuda.PROGRAMS.values() for k in kernels}
        self.driver = HostDriver(lib, self.signatures)
        self.context = HostDriver.CONTEXT
        self.kernels = {name: name for name in self.signatures}
        self.tables, self.launches = {}, []

    def launch(self, name, n, args, stream, block=speckv.cuda.BLOCK):
        kinds = self.signatures[name]
        assert len(args) == len(kinds), name
        # The driver reads each parameter's bytes from its array, as the kernel declares it: a
        # wrong width or a float's bits given as an integer would be read wrongly on a GPU
        for i, (k, a) in enumerate(zip(kinds, args)):
            assert a.nbytes == ctypes.sizeof(k), (
                f"{name} parameter {i}: {a.nbytes} bytes, the kernel reads {ctypes.sizeof(k)}"
            )
            if k in (ctypes.c_float, ctypes.c_double):
                assert a.dtype.kind == "f", f"{name} parameter {i}: a float given as {a.dtype}"
        self.launches.append((name, n, block))
        super().launch(name, n, args, stream, block)
