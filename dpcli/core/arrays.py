"""Small numpy helpers for the hot paths, chosen for what they cost at start-up as well as per call."""

from __future__ import annotations

import numpy as np


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """The distinct values of a 1-D array of integers, ascending: ``np.unique(values)``.

    ``np.unique`` imports ``numpy.ma`` on its first call (numpy 2.4), about 30 ms of every run
    that uses it; this is a sort and a comparison.
    """
    ordered = np.sort(np.asarray(values).ravel())
    if ordered.size < 2:
        return ordered
    keep = np.empty(ordered.size, dtype=bool)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]
