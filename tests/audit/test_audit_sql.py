"""Audit of ``dpcli sql``: every ANON_ function's released error is the noise its plan declares.

N public groups (``--keys``) hold the same users' rows (each user in one group), so every group's
true per-user partials, and so its true totals, are the same: one release gives N independent
samples of each aggregate. For counts and sums the error (released − true) is compared with the
declared discrete Laplace noise: its mean within 5 standard errors of 0, its variance within 5
standard errors of the declared one (a Laplace sample variance has standard error σ²·√(5/N)), and
the share of errors within the declared 95% margin within 5 binomial standard errors of ≥ 0.95.
For AVG, VAR, STDDEV and NTILE the released values are compared (two-sample Kolmogorov–Smirnov,
p > 1e-4) with the same post-processing applied to the true totals plus fresh draws of the declared
noise (and, for NTILE, a fresh exponential mechanism at the declared rate). A release calibrated
for 1.3·ε must fail the same checks.
"""

from __future__ import annotations

import hashlib
from fractions import Fraction

import numpy as np
import polars as pl
import pytest
from scipy import stats

from dpcli.core import mechanisms as mech
from dpcli.core.prf import KeyedStream
from dpcli.tasks import Frames, quantile_gaps
from dpcli.tasks.sql import Budget, SqlOptions, SqlTask, TableDecl

pytestmark = pytest.mark.audit

N = 20_000
VALUES = [[1.0, 9.0, 4.0], [7.5], [2.0, 2.0], [10.0, 0.5, 3.0, 8.0], [6.0]]  # five users' rows, every group
QUERY = ("SELECT g, ANON_COUNT(*, 3) AS c, ANON_COUNT(DISTINCT user) AS u, ANON_SUM(x, 0, 10) AS s, "
         "ANON_AVG(x, 0, 10) AS a, ANON_VAR(x, 0, 10) AS v, ANON_STDDEV(x, 0, 10) AS sd, "
         "ANON_MEDIAN(x, 0, 10) AS m FROM t GROUP BY g")


def _data() -> tuple[pl.LazyFrame, pl.LazyFrame]:
    users = [(g * len(VALUES) + i, g, x) for g in range(N) for i, xs in enumerate(VALUES) for x in xs]
    frame = pl.DataFrame(users, schema=["user", "g", "x"], orient="row").lazy()
    return frame, pl.DataFrame({"g": np.arange(N)}).lazy()


def _release(label: str) -> tuple[pl.DataFrame, SqlTask, object]:
    task = SqlTask.from_text(QUERY, {"t": TableDecl("t", "user", ("user", "g", "x"))},
                             SqlOptions(Budget(epsilon=Fraction(2)), keys=True))
    plan = task.plan("pure", {})
    data, keys = _data()
    frames = Frames(data, "t", None, data.collect_schema(), {"keys": keys})
    seed = hashlib.sha256(label.encode()).digest()
    return task.run(frames, plan, seed, None).table, task, plan


def _noise(plan: object, kind: str) -> mech.Noise:
    found = next(c.noise for c in plan.calibrated if c.measure.kind == kind)  # type: ignore[attr-defined]
    assert found is not None
    return found


def _error_checks(errors: np.ndarray, noise: mech.Noise, scale: float) -> list[str]:
    """What fails of the mean, variance and 95%-margin checks of ``errors`` against ``noise`` (× ``scale``)."""
    failed = []
    sigma = noise.std * scale
    if abs(errors.mean()) > 5 * sigma / np.sqrt(N):
        failed.append("mean")
    if abs(errors.var() / sigma**2 - 1) > 5 * np.sqrt(5 / N):
        failed.append("variance")
    inside = np.mean(np.abs(errors) <= noise.margin95() * scale + 1e-9)
    if inside < 0.95 - 5 * np.sqrt(0.05 * 0.95 / N):
        failed.append("margin")
    return failed


def _true() -> dict[str, float]:
    """One group's true totals, from the per-user partials of docs/commands/sql.md."""
    sums = [min(max(sum(xs), 0), 10) for xs in VALUES]
    return {"c": sum(min(len(xs), 3) for xs in VALUES), "u": len(VALUES), "s": sum(sums)}


def _simulated(task: SqlTask, plan: object, label: str) -> dict[str, np.ndarray]:
    """AVG, VAR, STDDEV and MEDIAN from the true totals plus fresh draws of the declared noise."""
    g = 2.0**-9  # the grid of [0, 10]: the largest power of two with at least 4096 steps
    mid = 5.0 / g
    means = [min(max(np.mean(xs), 0), 10) for xs in VALUES]
    squares = [min(np.mean([(x / g - mid) ** 2 for x in xs]), mid**2) for xs in VALUES]
    csum = sum(round(m / g) - mid for m in means)
    csq = sum(round(q) for q in squares)
    stream = KeyedStream(hashlib.sha256(label.encode()).digest(), "simulation")
    n = len(VALUES) + _noise(plan, "n").sample(stream.child("n"), N)
    users = np.maximum(n, 1).astype(float)
    mean_c = (csum + _noise(plan, "csum").sample(stream.child("csum"), N)) / users
    var = np.clip((csq + _noise(plan, "csq").sample(stream.child("csq"), N)) / users - mean_c**2, 0, mid**2) * g * g
    medians = [float(np.quantile(xs, 0.5, method="nearest")) for xs in VALUES]
    offsets, counts = np.unique(np.rint(np.clip(medians, 0, 10) / g).astype(np.int64), return_counts=True)
    rate = next(c.em_rate for c in plan.calibrated if c.measure.kind == "ntile")  # type: ignore[attr-defined]
    group = np.repeat(np.arange(N), offsets.size)
    choice = quantile_gaps.gap_quantiles(stream.child("ntile"), group, np.tile(offsets, N), np.tile(counts, N), N,
                                         int(10 / g), Fraction(1, 2), rate)
    return {"a": np.clip((mid + mean_c) * g, 0, 10), "v": var, "sd": np.sqrt(var), "m": choice * g}


def _audit(label: str, claimed: object | None = None) -> tuple[list[str], object]:
    """What fails of the checks, against the noise of ``claimed`` (a correctly calibrated plan; default:
    the release's own), and the release's plan."""
    out, task, plan = _release(label)
    plan = claimed or plan
    true = _true()
    failed = []
    for column, kind, scale in (("c", "rows", 1.0), ("u", "units", 1.0), ("s", "sum", 2.0**-9)):
        failed += [f"{column}: {f}" for f in _error_checks(out[column].to_numpy() - true[column], _noise(plan, kind),
                                                           scale)]
    simulated = _simulated(task, plan, label)
    for column, values in simulated.items():
        if stats.ks_2samp(out[column].to_numpy(), values).pvalue < 1e-4:
            failed.append(f"{column}: distribution")
    return failed, plan


def test_every_function_releases_its_declared_noise_and_a_broken_calibration_is_caught(monkeypatch):
    failed, claimed = _audit("ok")
    assert failed == []
    laplace = mech.laplace
    monkeypatch.setattr(mech, "laplace", lambda sensitivity, eps: laplace(sensitivity, eps * Fraction(13, 10)))
    broken, _ = _audit("broken", claimed)
    assert {"c: variance", "u: variance", "s: variance", "a: distribution"} <= set(broken), broken
