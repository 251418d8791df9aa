"""Runtime distributions and the portfolio speedup they predict (order statistics).

A portfolio of n independent runs finishes when its fastest run does, so its expected
runtime is E[min of n draws] of the sequential runtime distribution (Arbelaez,
Truchet and Codognet). Three laws are fitted by maximum likelihood:

- exponential(rate l): E[min_n] = 1 / (n l): linear speedup n;
- shifted exponential(x0, l): x0 = min, l = 1 / (mean - x0); E[min_n] = x0 + 1/(n l):
  speedup bounded by (x0 + 1/l) / x0;
- lognormal(mu, sigma): E[min_n] = integral of S(x)^n dx, computed by quadrature in
  log space (exact to the quadrature's tolerance);

and the empirical law of the sample: with sorted x_1..x_m, E[min_n] = sum_i x_i
(((m-i+1)/m)^n - ((m-i)/m)^n), exact for n draws with replacement. Each fit carries a
Kolmogorov-Smirnov statistic and p-value (optimistic, as the parameters come from the
same sample: Lilliefors' caveat).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .cnf import SatError

__all__ = ["Fit", "fit_laws", "expected_min", "expected_min_empirical", "speedup_table"]

LAWS = ("exponential", "shifted_exponential", "lognormal")


@dataclass
class Fit:
    """One fitted law: parameters, log-likelihood and Kolmogorov-Smirnov figures."""

    law: str
    params: dict[str, float]
    loglik: float
    ks_statistic: float
    ks_pvalue: float

    def cdf(self, x: np.ndarray) -> np.ndarray:
        """The fitted distribution function."""
        from scipy import stats

        p = self.params
        if self.law == "exponential":
            return stats.expon.cdf(x, scale=1 / p["rate"])
        if self.law == "shifted_exponential":
            return stats.expon.cdf(x, loc=p["shift"], scale=1 / p["rate"])
        return stats.lognorm.cdf(x, p["sigma"], scale=np.exp(p["mu"]))


def fit_laws(samples: Any) -> dict[str, Fit]:
    """Maximum-likelihood fits of the three laws to positive runtimes.

    Raises:
        SatError: fewer than 3 samples, or a runtime that is not positive and finite.
    """
    from scipy import stats

    x = np.asarray(samples, dtype=np.float64)
    if x.size < 3 or not np.all(np.isfinite(x)) or np.any(x <= 0):
        raise SatError("runtime fits need at least 3 positive, finite runtimes")
    mean, lo = float(x.mean()), float(x.min())
    rate = 1.0 / mean
    fits = {}
    ll = float(np.sum(stats.expon.logpdf(x, scale=mean)))
    fits["exponential"] = Fit(
        "exponential", {"rate": rate}, ll, *_ks(x, lambda v: stats.expon.cdf(v, scale=mean))
    )
    srate = 1.0 / (mean - lo) if mean > lo else float("inf")
    if np.isfinite(srate):
        ll = float(np.sum(stats.expon.logpdf(x, loc=lo, scale=mean - lo)))
        ks = _ks(x, lambda v: stats.expon.cdf(v, loc=lo, scale=mean - lo))
    else:
        ll, ks = float("nan"), (float("nan"), float("nan"))
    fits["shifted_exponential"] = Fit("shifted_exponential", {"shift": lo, "rate": srate}, ll, *ks)
    logs = np.log(x)
    mu, sigma = float(logs.mean()), float(logs.std())
    sigma = max(sigma, 1e-12)
    ll = float(np.sum(stats.lognorm.logpdf(x, sigma, scale=np.exp(mu))))
    ks = _ks(x, lambda v: stats.lognorm.cdf(v, sigma, scale=np.exp(mu)))
    fits["lognormal"] = Fit("lognormal", {"mu": mu, "sigma": sigma}, ll, *ks)
    return fits


def _ks(x: np.ndarray, cdf: Any) -> tuple[float, float]:
    from scipy import stats

    result = stats.kstest(x, cdf)
    return float(result.statistic), float(result.pvalue)


def expected_min(fit: Fit, n: int) -> float:
    """E[min of n independent draws] of the fitted law (see the module docstring)."""
    if n < 1:
        raise SatError(f"a portfolio needs at least one run, not {n}")
    p = fit.params
    if fit.law == "exponential":
        return 1.0 / (n * p["rate"])
    if fit.law == "shifted_exponential":
        return p["shift"] + 1.0 / (n * p["rate"])
    from scipy import integrate, special

    mu, sigma = p["mu"], p["sigma"]

    def f(z: float) -> float:  # x = exp(mu + sigma z): S(x)^n dx = Phi(-z)^n sigma x dz
        return float(np.exp(n * special.log_ndtr(-z) + mu + sigma * z) * sigma)

    # the integrand peaks near the minimum's typical z and vanishes fast on both sides
    total, _ = integrate.quad(f, -np.inf, np.inf, epsabs=0.0, epsrel=1e-10, limit=200)
    return float(total)


def expected_min_empirical(samples: Any, n: int) -> float:
    """E[min of n draws with replacement] from the sample, exactly."""
    x = np.sort(np.asarray(samples, dtype=np.float64))
    m = x.size
    i = np.arange(1, m + 1)
    weights = ((m - i + 1) / m) ** n - ((m - i) / m) ** n
    return float(np.dot(x, weights))


def speedup_table(samples: Any, cores: list[int]) -> list[dict[str, Any]]:
    """Per core count: predicted E[runtime] and speedup for each law and the sample."""
    fits = fit_laws(samples)
    mean = float(np.mean(samples))
    rows = []
    for n in cores:
        row: dict[str, Any] = {"cores": n}
        for law, fit in fits.items():
            t = expected_min(fit, n) if np.isfinite(fit.loglik) else float("nan")
            row[f"{law}_time"] = t
            row[f"{law}_speedup"] = expected_min(fit, 1) / t if t > 0 else float("nan")
        t = expected_min_empirical(samples, n)
        row["empirical_time"], row["empirical_speedup"] = t, mean / t
        rows.append(row)
    return rows
