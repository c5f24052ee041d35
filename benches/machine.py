"""What a benchmark's figures were measured on: the CPU model, its cores and the core's
kernels (speeds and restore/prefill ratios differ a lot between CPU families: print this
beside every timing)."""

from __future__ import annotations

import contextlib
import os
import platform

import speckv


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else the platform's processor string."""
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown"


def describe() -> dict[str, object]:
    """CPU model, cores and kernels, for a benchmark's JSON."""
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "kernels": speckv.kernel_report()}


def line() -> str:
    """``describe`` in one line, for a benchmark's printed header."""
    d = describe()
    kernels = ", ".join(f"{part} {k}" for part, k in speckv.kernel_report().items())
    return f"{d['cpu']}, {d['cores']} cores; kernels: {kernels}"
