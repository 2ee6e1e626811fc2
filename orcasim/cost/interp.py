"""Piecewise-linear lookup in measured tables, saying when a query leaves the measured range.

Inside the range a lookup interpolates linearly and returns the measured value exactly at
a measured point. Outside it extrapolates along the edge segment and flags the query, so
the caller can warn and count: a profile never extrapolates silently.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Table1D:
    """y(x) from measured points; x strictly increasing after construction."""

    x: np.ndarray
    y: np.ndarray

    @classmethod
    def from_points(cls, x: np.ndarray, y: np.ndarray) -> Table1D:
        """Sort, and average repeated measurements of the same x."""
        xs, inverse = np.unique(np.asarray(x, dtype=np.float64), return_inverse=True)
        ys = np.bincount(inverse, weights=np.asarray(y, dtype=np.float64)) / np.bincount(inverse)
        return cls(xs, ys)

    @property
    def bounds(self) -> tuple[float, float]:
        return float(self.x[0]), float(self.x[-1])

    def __call__(self, query: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
        """(values, out_of_range) for each query point."""
        q = np.asarray(query, dtype=np.float64)
        lo, hi = self.bounds
        outside = (q < lo) | (q > hi)
        if len(self.x) == 1:
            return np.full_like(q, self.y[0]), outside
        values = np.interp(q, self.x, self.y)
        if outside.any():
            values = np.where(q < lo, self._edge(q, 0), values)
            values = np.where(q > hi, self._edge(q, -2), values)
        return values, outside

    def _edge(self, q: np.ndarray, i: int) -> np.ndarray:
        x0, x1, y0, y1 = self.x[i], self.x[i + 1], self.y[i], self.y[i + 1]
        return y0 + (y1 - y0) * (q - x0) / (x1 - x0)


@dataclass(frozen=True)
class SlicedTable2D:
    """z(a, b) from a ragged grid: for each measured a, a Table1D over b.

    A query interpolates over b inside the two slices that bracket a, then linearly over a.
    The slices may cover different ranges of b (prefill tables stop at the model length).
    """

    a: np.ndarray
    slices: tuple[Table1D, ...]

    @classmethod
    def from_points(cls, a: np.ndarray, b: np.ndarray, z: np.ndarray) -> SlicedTable2D:
        a = np.asarray(a, dtype=np.float64)
        keys = np.unique(a)
        slices = tuple(Table1D.from_points(np.asarray(b)[a == k], np.asarray(z)[a == k]) for k in keys)
        return cls(keys, slices)

    def __call__(
        self, qa: np.ndarray | float, qb: np.ndarray | float
    ) -> tuple[np.ndarray, np.ndarray]:
        qa, qb = np.broadcast_arrays(np.asarray(qa, np.float64), np.asarray(qb, np.float64))
        if len(self.a) == 1:
            values, outside = self.slices[0](qb)
            return values, outside | (qa != self.a[0])
        # Bracketing slices; an `a` beyond either end uses the edge pair (extrapolation).
        hi = np.clip(np.searchsorted(self.a, qa, side="left"), 1, len(self.a) - 1)
        lo = hi - 1
        values = np.empty(qa.shape)
        outside = np.asarray((qa < self.a[0]) | (qa > self.a[-1]))  # an array even for scalar queries
        for i in np.unique(lo):
            sel = lo == i
            z0, out0 = self.slices[i](qb[sel])
            z1, out1 = self.slices[i + 1](qb[sel])
            w = (qa[sel] - self.a[i]) / (self.a[i + 1] - self.a[i])
            exact_lo, exact_hi = w == 0.0, w == 1.0
            values[sel] = np.where(exact_hi, z1, z0 + w * (z1 - z0))
            outside[sel] |= (out0 & ~exact_hi) | (out1 & ~exact_lo)
        return values, outside
