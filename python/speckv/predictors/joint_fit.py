"""Fitting the joint residual model at calibration (``JointFit``): per layer a gain on each
channel's prediction, then each channel's conditional mean and sigma given the channels coded
before it, from shrunk covariances of the residuals; and the model's compact form in a
calibration file (float16 coefficients, exact)."""

from __future__ import annotations

from typing import Any

import torch

# Shrinkage of the residual covariances toward their diagonal (see JointFit).
JOINT_SHRINKAGE = 0.05


class JointFit:
    """The joint residual model of each layer. First a gain per channel on its own prediction
    (``scale = 1 + g``, ``g`` the least-squares slope of the residual on ``mu``); then the
    remaining residuals of a token's K channels then V channels (``C = 2 x heads x dim``,
    channel ``(kv, h, d)`` at ``kv*H*D + h*D + d``) as one Gaussian vector, its covariance
    shrunk toward the diagonal (``(1-l) S + l diag(S)``, ``l`` the larger of ``shrinkage`` and
    ``2 C / tokens``), then each channel's conditional mean given the channels before it and
    its conditional sigma:
    from the Cholesky factor ``S = L L^T``, with ``L1 = L / diag(L)``, the coefficients are
    ``I - L1^-1`` (strictly lower) and the sigmas ``diag(L)``. The mean residual is kept as
    an offset: ``mu' = mu + (b_i - sum_j a_ij b_j) + sum_j a_ij e_j``."""

    def __init__(self, layers: int, heads: int, dim: int) -> None:
        c = 2 * heads * dim
        self.heads, self.dim = heads, dim
        self.gram = torch.zeros(layers, c, c, dtype=torch.float64)
        self.sum = torch.zeros(layers, c, dtype=torch.float64)
        self.n = torch.zeros(layers, dtype=torch.float64)
        # for the per-channel gain on the prediction (structure "affine" and above): sums of
        # mu, mu^2 and mu*e per channel, and the cross grams that correct `gram` for it
        self.mu_sum = torch.zeros(layers, c, dtype=torch.float64)
        self.gram_me = torch.zeros(layers, c, c, dtype=torch.float64)
        self.gram_mm = torch.zeros(layers, c, c, dtype=torch.float64)
        # what ``solve`` did about degenerate channels, per layer (recorded in the calibration)
        self.repairs: dict[str, dict[str, Any]] = {}

    def add(
        self, layer: int, k_error: torch.Tensor, v_error: torch.Tensor, k_mu: torch.Tensor, v_mu: torch.Tensor
    ) -> None:
        """One prompt's residuals of a layer and the predictions they are from, ``[batch,
        heads, tokens, dim]`` each."""

        def rows(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            flat = [t.permute(0, 2, 1, 3).reshape(-1, self.heads * self.dim) for t in (a, b)]
            return torch.cat(flat, dim=1).double()

        e, m = rows(k_error, v_error), rows(k_mu, v_mu)
        if self.gram.device != e.device:
            # a GPU's residuals are summed on the GPU (float64 products: not bit for bit the
            # host's sums, unlike the per-channel statistics; the calibration file decides)
            for name in ("gram", "sum", "n", "mu_sum", "gram_me", "gram_mm"):
                setattr(self, name, getattr(self, name).to(e.device))
        self.gram[layer] += e.T @ e
        self.sum[layer] += e.sum(dim=0)
        self.n[layer] += e.shape[0]
        self.mu_sum[layer] += m.sum(dim=0)
        self.gram_me[layer] += m.T @ e
        self.gram_mm[layer] += m.T @ m

    # What each structure conditions a channel on (``speckv eval --ablate`` compares them):
    # "offset" only the mean residual, "affine" also a gain on its own prediction, "within"
    # also the earlier channels of its own K or V, "full" also, for V, every K channel of the
    # same token.
    STRUCTURES = ("offset", "affine", "within", "full")

    def solve(self, layers: list[int], shrinkage: float, structure: str = "full") -> dict[str, torch.Tensor]:
        for name in ("gram", "sum", "n", "mu_sum", "gram_me", "gram_mm"):
            setattr(self, name, getattr(self, name).cpu())
        if structure not in self.STRUCTURES:
            raise ValueError(f"structure: expected one of {self.STRUCTURES}, got {structure!r}")
        n_layers, c, _ = self.gram.shape
        coef = torch.zeros(n_layers, c, c, dtype=torch.float64)
        offset = torch.zeros(n_layers, c, dtype=torch.float64)
        sigma = torch.zeros(n_layers, c, dtype=torch.float64)
        eye = torch.eye(c, dtype=torch.float64)
        scale = torch.ones(n_layers, c, dtype=torch.float64)
        for layer in layers:
            n = float(self.n[layer].clamp(min=1))
            gram, total = self.gram[layer], self.sum[layer]
            if structure != "offset":
                # least squares of e on mu per channel (ridge 1e-3 of mu's variance), then the
                # statistics of the corrected residual e - g mu
                mu_mean = self.mu_sum[layer] / n
                var_mu = self.gram_mm[layer].diagonal() / n - mu_mean**2
                cov_me = self.gram_me[layer].diagonal() / n - mu_mean * total / n
                g = cov_me / (var_mu * 1.001 + 1e-12)
                g = _half_exact(1 + g).double() - 1  # what the file stores, exactly
                gram = (
                    gram
                    - g[:, None] * self.gram_me[layer]
                    - self.gram_me[layer].T * g[None, :]
                    + g[:, None] * self.gram_mm[layer] * g[None, :]
                )
                total = total - g * self.mu_sum[layer]
                scale[layer] = 1 + g
            mean = total / n
            cov = gram / n - torch.outer(mean, mean)
            cov, repair = _degenerate_channels(cov)
            diag = cov.diagonal()
            # few tokens per channel: a sample covariance overfits, so shrink harder
            lam = min(1.0, max(shrinkage, 2 * c / n))
            cov = (1 - lam) * cov + lam * torch.diag(diag)
            if structure in ("offset", "affine"):
                cov = torch.diag(diag)
            elif structure == "within":
                half = c // 2
                cov[:half, half:] = 0
                cov[half:, :half] = 0
            chol, info = torch.linalg.cholesky_ex(cov + 1e-12 * eye)
            if int(info) != 0:
                # rank-deficient past the shrinkage (rounding in the sums): clip the eigenvalues
                cov = _clip_eigenvalues(cov)
                repair["eigenvalues_clipped"] = True
                chol = torch.linalg.cholesky(cov + 1e-12 * eye)
            if repair:
                self.repairs[str(layer)] = repair
            d = chol.diagonal()
            unit = chol / d[None, :]
            a = eye - torch.linalg.solve_triangular(unit, eye, upper=False, unitriangular=True)
            a = torch.tril(a, diagonal=-1)
            coef[layer] = a
            offset[layer] = mean - a @ mean
            sigma[layer] = d
        return {
            "coef": _half_exact(coef),
            "offset": _half_exact(offset),
            "scale": _half_exact(scale),
            "sigma": sigma.reshape(n_layers, 2, self.heads, self.dim).float(),
        }


# A channel whose residual variance is below this share of the layer's mean is degenerate
# (constant, or nearly): it is taken out of the joint model (no coefficient to or from it).
DEGENERATE_SHARE = 1e-10
# Smallest eigenvalue kept, as a share of the largest, where a covariance must be repaired.
EIGEN_FLOOR = 1e-9


def _degenerate_channels(cov: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
    """``cov`` with its degenerate channels (variance at most DEGENERATE_SHARE of the mean,
    or negative from rounding) decoupled from the others, their variance floored; and what
    was done, for the calibration's metadata."""
    diag = cov.diagonal()
    scale = float(diag.clamp(min=0).mean())
    floor = max(scale * DEGENERATE_SHARE, 1e-30)
    bad = diag <= floor
    if not bool(bad.any()):
        return cov, {}
    cov = cov.clone()
    cov[bad, :] = 0
    cov[:, bad] = 0
    idx = bad.nonzero().flatten()
    cov[idx, idx] = floor
    return cov, {"degenerate_channels": [int(i) for i in idx]}


def _clip_eigenvalues(cov: torch.Tensor) -> torch.Tensor:
    """The nearest symmetric matrix with every eigenvalue at least EIGEN_FLOOR of the largest."""
    sym = (cov + cov.T) / 2
    w, v = torch.linalg.eigh(sym)
    w = w.clamp(min=float(w.max()) * EIGEN_FLOOR)
    return (v * w) @ v.T


# Largest magnitude a joint coefficient or offset may take (float16 holds up to 65504).
JOINT_LIMIT = 60000.0


def _half_exact(t: torch.Tensor) -> torch.Tensor:
    """``t`` rounded to float16 values, as float32: what the calibration file stores (in
    half the bytes) is then exactly what the codec computed with."""
    return t.clamp(-JOINT_LIMIT, JOINT_LIMIT).half().float()


def pack_joint(parts: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A joint model as saved: the strictly lower triangle of ``coef`` (the rest is zero) and
    ``offset`` in float16 (exact: ``_half_exact``), ``sigma`` in float32."""
    coef = parts["coef"]
    rows, cols = torch.tril_indices(coef.shape[1], coef.shape[2], offset=-1)
    packed = {
        "coef_tril": coef[:, rows, cols].half(),
        "offset": parts["offset"].half(),
        "sigma": parts["sigma"].float(),
    }
    if "scale" in parts:
        packed["scale"] = parts["scale"].half()
    return packed


def unpack_joint(parts: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    if "coef_tril" not in parts:
        return {name: t.float() for name, t in parts.items()}
    offset = parts["offset"].float()
    layers, c = offset.shape
    coef = torch.zeros(layers, c, c, dtype=torch.float32)
    rows, cols = torch.tril_indices(c, c, offset=-1)
    coef[:, rows, cols] = parts["coef_tril"].float()
    out = {"coef": coef, "offset": offset, "sigma": parts["sigma"].float()}
    if "scale" in parts:
        out["scale"] = parts["scale"].float()
    return out
