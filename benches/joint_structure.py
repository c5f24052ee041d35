"""What cheaper forms of the joint residual model would cost in bits, before one is built: the
statistics predictor's joint model (every channel conditioned on every channel before it, ~192
terms a scalar on the demo model) against forms whose sums are O(rank) per scalar (running
prefix sums of a few projections) or O(head) (a head's own channels only), each fitted on the
calibration text and scored on held-out text of another genre.

    python benches/joint_structure.py                  # ranks 8, 16, 32, 64; legal text
    python benches/joint_structure.py --ranks 16,64 --text code --json out.json

Score: a linear conditional model leaves channel ``i`` a residual ``r_i``; coded with a sigma
matched to it, a channel costs ``0.5 log2 E[r_i^2]`` bits plus what every model shares, so a
form's cost against the full model is the mean over channels of ``0.5 log2(E[r_i^2] /
E[r_full,i^2])``: second moments over the held-out tokens, exact for each linear model (no
coder runs). The same quantity gives the full model's own gain over no joint model.

The forms:

- ``full``: the calibration's model (``JointFit.solve``, the coefficients as float16, as coded);
- ``factor:r``: the residuals as ``W z + d`` (``r`` factors, fitted by principal-axis
  factoring of the shrunk covariance); the conditional mean given the channels before is then
  ``u_i . S_i`` with ``S_i = sum_{j<i} v_j e_j`` a running r-vector (exact for that model);
- ``head``: each channel conditioned on the earlier channels of its own head (K or V) only;
- ``head+r``: ``head`` and ``r`` projections of every earlier head's channels (least squares
  for each channel given those regressors).

Demo model, CPU; the numbers are properties of the models, not of the machine."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import torch


def _moments(fit: Any, layer: int, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(E[e e^T], E[e])`` of a layer's residuals after the gain ``g`` (``e - g mu``), from a
    ``JointFit``'s sums, as ``JointFit.solve`` corrects them."""
    n = float(fit.n[layer].clamp(min=1))
    gram = (
        fit.gram[layer]
        - g[:, None] * fit.gram_me[layer]
        - fit.gram_me[layer].T * g[None, :]
        + g[:, None] * fit.gram_mm[layer] * g[None, :]
    )
    return gram / n, (fit.sum[layer] - g * fit.mu_sum[layer]) / n


def _residual_power(a: torch.Tensor, offset: torch.Tensor, m2: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """``E[r_i^2]`` per channel for ``r = (I - A) e - offset`` under moments ``m2``, ``m``."""
    ia = torch.eye(a.shape[0], dtype=torch.float64) - a
    cross = ia @ m
    return torch.einsum("ij,jk,ik->i", ia, m2, ia) - 2 * cross * offset + offset**2


def _factor(cov: torch.Tensor, rank: int, iterations: int = 60) -> tuple[torch.Tensor, torch.Tensor]:
    """Principal-axis factoring: ``cov ~ W W^T + diag(d)``."""
    d = cov.diagonal() * 0.5
    w = torch.zeros(cov.shape[0], rank, dtype=torch.float64)
    for _ in range(iterations):
        vals, vecs = torch.linalg.eigh(cov - torch.diag(d))
        w = vecs[:, -rank:] * vals[-rank:].clamp(min=0).sqrt()
        d = (cov.diagonal() - (w * w).sum(1)).clamp(min=cov.diagonal() * 1e-3)
    return w, d


def _factor_coefficients(w: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """The factor model's conditional-mean coefficients in channel order (strictly lower):
    ``a_ij = u_i . v_j``, ``u_i = P_i^-1 w_i``, ``v_j = w_j / d_j``, ``P_i = I + sum_{j<i} w_j
    w_j^T / d_j`` (the posterior precision of ``z`` after channels ``..i``)."""
    c, r = w.shape
    precision = torch.eye(r, dtype=torch.float64)
    u = torch.zeros_like(w)
    for i in range(c):
        u[i] = torch.linalg.solve(precision, w[i])
        precision = precision + torch.outer(w[i], w[i]) / d[i]
    return torch.tril(u @ (w / d[:, None]).T, -1)


def _regression_coefficients(cov: torch.Tensor, head: int, projections: torch.Tensor | None) -> torch.Tensor:
    """Per channel, least squares on its own head's earlier channels and (``projections``,
    ``C x r``) ``r`` projections of the channels of every earlier head, as coefficients on
    ``e`` (strictly lower)."""
    c = cov.shape[0]
    eye = torch.eye(c, dtype=torch.float64)
    a = torch.zeros(c, c, dtype=torch.float64)
    for i in range(c):
        start = i // head * head
        rows = [eye[j] for j in range(start, i)]
        if projections is not None and start > 0:
            earlier = projections.clone()
            earlier[start:] = 0
            rows += list(earlier.T)
        if not rows:
            continue
        r = torch.stack(rows)
        sxx = r @ cov @ r.T + 1e-12 * torch.eye(len(rows), dtype=torch.float64)
        a[i] = torch.linalg.solve(sxx, r @ cov[:, i]) @ r
    return a


def measure(text: str, ranks: list[int], samples: int, seq: int, held_out: int) -> dict[str, Any]:
    from speckv.cli.common import text as bundled
    from speckv.cli.predictor_spec import make_predictor
    from speckv.hf import load_demo_model
    from speckv.models.cache import prefill
    from speckv.models.demo import bundled_text, prompts
    from speckv.predictors import calibration as calibration_module
    from speckv.predictors.joint_fit import JOINT_SHRINKAGE, JointFit

    model, tokenizer = load_demo_model()
    torch.set_num_threads(os.cpu_count() or 1)
    predictor = make_predictor("stats", model, None)
    train = prompts(tokenizer, bundled_text("calibration"), seq, samples)
    cal = calibration_module.calibrate(
        model, predictor, train, fingerprint="joint-structure", joint=True, keep_joint_fits=True
    )
    fit = cal.joint_fits["bf16"]
    layers = [int(v) for v in cal.metadata["joint"]["layers"]]
    solved = fit.solve(layers, JOINT_SHRINKAGE)
    heads, dim = fit.heads, fit.dim
    test = JointFit(len(fit.n), heads, dim)
    with torch.no_grad():
        for ids in prompts(tokenizer, bundled(text), seq, held_out):
            true = prefill(model, ids)
            pred = predictor.predict(ids)
            for layer in layers:
                (k, v), (pk, pv) = true[layer], pred[layer]
                pk, pv = pk.to(k.dtype).double(), pv.to(v.dtype).double()
                test.add(layer, k.double() - pk, v.double() - pv, pk, pv)
    forms = ["none", "head"] + [f"factor:{r}" for r in ranks] + [f"head+{r}" for r in ranks]
    cost: dict[str, list[float]] = {f: [] for f in forms}
    for layer in layers:
        g = solved["scale"][layer].double() - 1
        m2_train, mean_train = _moments(fit, layer, g)
        c = m2_train.shape[0]
        cov = m2_train - torch.outer(mean_train, mean_train)
        lam = min(1.0, max(JOINT_SHRINKAGE, 2 * c / float(fit.n[layer])))
        cov = (1 - lam) * cov + lam * torch.diag(cov.diagonal())
        m2, mean = _moments(test, layer, g)
        full = _residual_power(solved["coef"][layer].double(), solved["offset"][layer].double(), m2, mean)
        scale = cov.diagonal().rsqrt()
        _, vecs = torch.linalg.eigh(scale[:, None] * cov * scale[None, :])
        for form in forms:
            if form == "none":
                a = torch.zeros(c, c, dtype=torch.float64)
            elif form == "head":
                a = _regression_coefficients(cov, dim, None)
            elif form.startswith("factor:"):
                a = _factor_coefficients(*_factor(cov, int(form.split(":")[1])))
            else:
                r = int(form.split("+")[1])
                a = _regression_coefficients(cov, dim, scale[:, None] * vecs[:, -r:])
            power = _residual_power(a, mean_train - a @ mean_train, m2, mean)
            cost[form].append(float((0.5 * torch.log2(power.clamp(min=1e-30) / full.clamp(min=1e-30))).mean()))
        print(f"layer {layer}: " + ", ".join(f"{f} {cost[f][-1]:+.3f}" for f in forms), file=sys.stderr, flush=True)
    per_scalar = {f: sum(v) / len(v) for f, v in cost.items()}
    return {
        "text": text,
        "train": f"bundled calibration text, {samples} x {seq} tokens",
        "held_out": f"{text}, {held_out} x {seq} tokens",
        "layers": len(layers),
        "channels": 2 * heads * dim,
        "bits_over_full": per_scalar,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--text", default="legal", help="held-out bundled text (default legal)")
    p.add_argument("--ranks", default="8,16,32,64")
    p.add_argument("--samples", type=int, default=32, help="calibration prompts (default 32)")
    p.add_argument("--held-out", type=int, default=4, help="held-out prompts (default 4)")
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    ranks = [int(r) for r in args.ranks.split(",") if r]
    out = measure(args.text, ranks, args.samples, args.seq_len, args.held_out)
    print(
        f"joint model forms, bits/scalar over the full model (held-out {out['held_out']}; "
        f"{out['channels']} channels, {out['layers']} layers; 'none' = no joint model):"
    )
    for form, bits in out["bits_over_full"].items():
        print(f"  {form:10s} {bits:+.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
