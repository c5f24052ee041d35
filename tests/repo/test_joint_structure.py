"""``benches/joint_structure.py``'s cheaper forms of the joint model, checked against the full
model where they must agree with it: a covariance that is exactly a factor model has the
factor form's coefficients as its Cholesky coefficients, and a "head" as wide as the layer is
the full model; the residual power of a model is its residuals' second moment."""

from __future__ import annotations

import pathlib
import sys

import pytest

torch = pytest.importorskip("torch", reason="the hf extra: pip install 'speckv-rs[hf]'")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benches"))
import joint_structure  # noqa: E402


def _cholesky_coefficients(cov: torch.Tensor) -> torch.Tensor:
    """``JointFit.solve``'s coefficients: ``I - L1^-1`` (strictly lower), ``L1`` unit."""
    chol = torch.linalg.cholesky(cov)
    unit = chol / chol.diagonal()[None, :]
    eye = torch.eye(cov.shape[0], dtype=torch.float64)
    return torch.tril(eye - torch.linalg.inv(unit), -1)


def _factor_covariance(c: int, r: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(5)
    w = torch.randn(c, r, generator=gen, dtype=torch.float64)
    d = torch.rand(c, generator=gen, dtype=torch.float64) + 0.5
    return w @ w.T + torch.diag(d), w, d


def test_the_factor_form_is_the_full_model_of_a_factor_covariance():
    cov, w, d = _factor_covariance(24, 3)
    got = joint_structure._factor_coefficients(w, d)
    assert torch.allclose(got, _cholesky_coefficients(cov), atol=1e-9)


def test_principal_axis_factoring_finds_a_factor_covariance():
    cov, _, d = _factor_covariance(40, 2)
    w, found = joint_structure._factor(cov, 2, iterations=400)
    assert torch.allclose(w @ w.T + torch.diag(found), cov, atol=1e-3)


def test_a_head_as_wide_as_the_layer_is_the_full_model():
    cov, _, _ = _factor_covariance(16, 4)
    got = joint_structure._regression_coefficients(cov, 16, None)
    assert torch.allclose(got, _cholesky_coefficients(cov), atol=1e-9)


def test_projections_of_every_earlier_channel_recover_the_full_model():
    # as many projections as channels: the earlier heads are seen whole
    cov, _, _ = _factor_covariance(12, 3)
    got = joint_structure._regression_coefficients(cov, 4, torch.eye(12, dtype=torch.float64))
    assert torch.allclose(got, _cholesky_coefficients(cov), atol=1e-8)


def test_residual_power_is_the_residuals_second_moment():
    gen = torch.Generator().manual_seed(9)
    e = torch.randn(5000, 6, generator=gen, dtype=torch.float64) @ torch.randn(6, 6, generator=gen, dtype=torch.float64)
    e += 0.3
    a = torch.tril(torch.randn(6, 6, generator=gen, dtype=torch.float64), -1) * 0.2
    offset = torch.randn(6, generator=gen, dtype=torch.float64) * 0.1
    r = e - e @ a.T - offset
    got = joint_structure._residual_power(a, offset, e.T @ e / len(e), e.mean(0))
    assert torch.allclose(got, (r * r).mean(0), rtol=1e-9)
