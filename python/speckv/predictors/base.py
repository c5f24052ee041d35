"""Predictors: anything that maps a prompt to a predicted cache of the same shape.

Predictions must be bit-identical when the decoder recomputes them. On one machine that holds
for the built-in predictors whatever torch's thread count, because they run their forward pass
with a fixed number of threads (``threads``, default 1): CPU kernels may split reductions
differently with more threads, which changes the last bits. Across machines the same torch
version, dtype and CPU instruction set are needed; the stream's prediction fingerprint refuses
to decode (``PredictionMismatchError``) when they differ instead of returning wrong values.
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Iterator
from typing import Any, Protocol, Union, runtime_checkable

import torch

from ..models.cache import KV, prefill
from .layerwise import LayerwisePredictor

FP8_MAX = 448.0


@runtime_checkable
class Predictor(Protocol):
    """Predicts the per-layer ``(K, V)`` of a prompt, shaped like the true cache.

    A predictor may also have ``describe() -> dict``: the settings that determine its
    predictions, recorded in calibrations and streams so that a decoder with other settings
    is refused. Without it, the class name is recorded."""

    def predict(self, input_ids: torch.Tensor) -> KV: ...


# What the codec, calibration and stores accept: a whole-prompt predictor or a layer-wise one
# (``speckv.predictors.layerwise``), told apart by ``is_layerwise``.
AnyPredictor = Union[Predictor, LayerwisePredictor]


def describe(predictor: object) -> dict[str, Any]:
    """``predictor.describe()``, or its class name for predictors that do not say more."""
    method = getattr(predictor, "describe", None)
    if callable(method):
        return dict(method())
    return {"name": type(predictor).__qualname__}


@contextlib.contextmanager
def fixed_threads(n: int) -> Iterator[None]:
    """Run torch on exactly ``n`` intra-op threads, then restore the previous count."""
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def fp8_round_trip(weight: torch.Tensor, block_size: int | None = None) -> torch.Tensor:
    """``weight`` stored as float8_e4m3fn with an absmax scale (per tensor, or per
    ``block_size x block_size`` block as in public FP8 checkpoints), read back as float32."""
    w = weight.detach().float()
    if block_size is None:
        scale = w.abs().amax().clamp(min=1e-12) / FP8_MAX
        return (w / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float() * scale
    rows, cols = w.shape
    pr, pc = (-rows) % block_size, (-cols) % block_size
    padded = torch.nn.functional.pad(w, (0, pc, 0, pr))
    blocks = padded.reshape(padded.shape[0] // block_size, block_size, padded.shape[1] // block_size, block_size)
    scale = blocks.abs().amax(dim=(1, 3), keepdim=True).clamp(min=1e-12) / FP8_MAX
    q = (blocks / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float() * scale
    return q.reshape(padded.shape)[:rows, :cols].contiguous()


def decoder_layers(model: Any) -> Any:
    inner = getattr(model, "model", model)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise TypeError(f"{type(model).__name__}: no decoder layers found at model.model.layers")
    return layers


class ThreadDependenceError(ValueError):
    """A predictor's output changed with torch's thread count, so it cannot run on "all"."""


class Fp8Predictor:
    """The same model with every decoder linear weight round-tripped through float8_e4m3fn,
    run in float32 (so its predictions keep more precision than the bf16 cache they predict),
    or in bfloat16 (``dtype=torch.bfloat16``: ~3x faster on CPUs with bf16 matmuls, a few
    percent more bits).

    ``threads``: torch threads of its forward pass, recorded in streams (a decoder must use the
    same number). ``threads="all"`` runs on every core and records ``"any"``: allowed only
    after a probe finds its predictions identical on 1, 2 and all cores (else
    ``ThreadDependenceError``); a decoder whose predictions still differ is refused by the
    stream's prediction fingerprint (``PredictionMismatchError``), never decoded wrongly.

    ``device="cuda"`` runs it on the GPU where the cache lives, with TF32 and reduced-precision
    reductions off; streams record the GPU's name, since predictions agree on one GPU type and
    software stack. A decoder elsewhere (a CPU) rebuilds it on what it has, and the prediction
    fingerprint decides whether the bits agree.
    """

    def __init__(
        self,
        model: Any,
        *,
        block_size: int | None = None,
        threads: int | str = 1,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device | None = None,
    ) -> None:
        self.device = torch.device(device if device is not None else "cpu")
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("device: no CUDA device here")
        if threads != "all" and (not isinstance(threads, int) or isinstance(threads, bool) or threads < 1):
            raise ValueError(f"threads: expected a positive int or 'all', got {threads!r}")
        self.block_size = block_size
        self.threads = threads
        self.dtype = dtype
        self.model = copy.deepcopy(model).to(dtype).eval()
        with torch.no_grad():
            for module in decoder_layers(self.model).modules():
                if isinstance(module, torch.nn.Linear):
                    module.weight.copy_(fp8_round_trip(module.weight, block_size).to(dtype))
        self.model.to(self.device)
        if threads == "all" and self.device.type == "cpu":  # CPU threads do not touch a GPU's sums
            self.check_thread_invariance()

    def _thread_count(self) -> int:
        return (os.cpu_count() or 1) if self.threads == "all" else int(self.threads)

    def check_thread_invariance(self, input_ids: torch.Tensor | None = None) -> None:
        """Raises ``ThreadDependenceError`` unless predictions on 1, 2 and all cores are
        bit-identical (on ``input_ids``, default a 96-token probe of fixed pseudo-random ids)."""
        if input_ids is None:
            g = torch.Generator().manual_seed(0)
            input_ids = torch.randint(0, int(self.model.config.vocab_size), (1, 96), generator=g)
        counts = sorted({1, 2, os.cpu_count() or 1})
        runs = []
        with torch.no_grad():
            for n in counts:
                with fixed_threads(n):
                    runs.append(prefill(self.model, input_ids))
        for n, kv in zip(counts[1:], runs[1:]):
            for (k, v), (k1, v1) in zip(kv, runs[0]):
                if not (torch.equal(k, k1) and torch.equal(v, v1)):
                    raise ThreadDependenceError(
                        f"the fp8 predictor's output differs between 1 and {n} threads here: give a fixed threads="
                    )

    def describe(self) -> dict[str, Any]:
        return {
            "name": "fp8",
            "weights": "float8_e4m3fn",
            "scale": "per-tensor absmax" if self.block_size is None else f"{self.block_size}x{self.block_size} blocks",
            "compute_dtype": str(self.dtype).replace("torch.", ""),
            "threads": "any" if self.threads == "all" else self.threads,
            "torch": torch.__version__,
            # only off the CPU, so CPU calibrations and streams keep their descriptions
            **({"device": torch.cuda.get_device_name(self.device)} if self.device.type == "cuda" else {}),
        }

    @torch.no_grad()
    def predict(self, input_ids: torch.Tensor) -> KV:
        with fixed_threads(self._thread_count()), _exact_cuda_matmuls(self.device):
            kv = prefill(self.model, input_ids.to(self.device))
        return [(k.float(), v.float()) for k, v in kv]


@contextlib.contextmanager
def _exact_cuda_matmuls(device: torch.device) -> Iterator[None]:
    """On a GPU: float32 products in float32 (no TF32) and no reduced-precision reductions,
    restored afterwards; nothing on a CPU."""
    if device.type != "cuda":
        yield
        return
    flags = [
        (torch.backends.cuda.matmul, "allow_tf32"),
        (torch.backends.cudnn, "allow_tf32"),
        (torch.backends.cuda.matmul, "allow_bf16_reduced_precision_reduction"),
        (torch.backends.cuda.matmul, "allow_fp16_reduced_precision_reduction"),
    ]
    saved = [getattr(owner, name) for owner, name in flags]
    try:
        for owner, name in flags:
            setattr(owner, name, False)
        yield
    finally:
        for (owner, name), value in zip(flags, saved):
            setattr(owner, name, value)


class ChannelStatsPredictor:
    """No model: predicts every position as the per-(layer, K/V, head, channel) mean seen in
    calibration. The cheap baseline, and with the joint residual model the answer to "how far
    does a cache compress with no forward pass at all?". Without ``means`` it learns them from
    the calibration caches (``fit_from_caches``) and keeps them in the calibration file."""

    def __init__(self, means: torch.Tensor | None = None) -> None:
        if means is not None and (means.ndim != 4 or means.shape[1] != 2):
            raise ValueError("means: expected shape [layers, 2, kv_heads, head_dim]")
        self.means = means.float() if means is not None else None
        self._given = means is not None

    def describe(self) -> dict[str, Any]:
        return {"name": "channel-stats"}

    def fit_from_caches(self, caches: list[KV]) -> None:
        """The per-channel means of the calibration caches (kept as given, if given)."""
        if self._given:
            return
        total, count = None, None
        for kv in caches:
            layer_sums = torch.stack([torch.stack([t.double().sum(dim=(0, 2)) for t in pair]) for pair in kv])
            # per layer: a sliding-window layer holds fewer tokens than the prompt
            tokens = torch.tensor([float(k.shape[0] * k.shape[2]) for k, _ in kv], dtype=torch.float64)
            total = layer_sums if total is None else total + layer_sums
            count = tokens if count is None else count + tokens
        if total is None or count is None:
            raise ValueError("caches: at least one is needed")
        self.means = (total / count[:, None, None, None]).float()

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {} if self.means is None else {"means": self.means}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if "means" in state:
            self.means = state["means"].float()

    def predict(self, input_ids: torch.Tensor) -> KV:
        """Every position of the prompt (a sliding-window layer's cache holds the last ones:
        the codec takes those)."""
        if self.means is None:
            raise ValueError("ChannelStatsPredictor: no means yet (give them, or calibrate first)")
        batch, seq = input_ids.shape
        out = []
        for layer in self.means:
            k, v = (m[None, :, None, :].expand(batch, -1, seq, -1).contiguous() for m in layer)
            out.append((k, v))
        return out
