"""Token-length distributions. Each one knows its theoretical mean (`mean_tokens`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import pandas as pd
from pydantic import Field, PositiveFloat, model_validator

from orcasim.config import ScenarioError, Strict, check_rng
from orcasim.paths import (
    DataPath,
    csv_data_line,
    read_csv,
    read_once,
    resolve_data_path,
    shown_columns,
)

# The longest request length accepted anywhere (a prompt, an output, a limit): far above any
# model's context today, and far below where int64 token sums or float64 times lose digits.
MAX_LENGTH_TOKENS = 10**9
LENGTH_EXPECTED = f"an integer from 1 to {MAX_LENGTH_TOKENS:,}"
TokenCount = Annotated[int, Field(ge=1, le=MAX_LENGTH_TOKENS)]


class ConstantLength(Strict):
    kind: Literal["constant"]
    value: TokenCount

    def mean_tokens(self) -> float:
        return float(self.value)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        check_rng(rng)
        return np.full(n, self.value, dtype=np.int64)


class UniformLength(Strict):
    """Integer uniform on [low, high], both inclusive."""

    kind: Literal["uniform"]
    low: TokenCount
    high: TokenCount

    @model_validator(mode="after")
    def _ordered(self) -> UniformLength:
        if self.low > self.high:
            raise ScenarioError(f"low ({self.low}) must be <= high ({self.high})")
        return self

    def mean_tokens(self) -> float:
        return (self.low + self.high) / 2.0

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        check_rng(rng)
        return rng.integers(self.low, self.high + 1, size=n, dtype=np.int64)


EXACT_MEAN_SUPPORT = 1_000_000  # tokens a lognormal's mean is summed over, at most
MAX_SIGMA = 100.0  # a lognormal length's sigma, at most (e^100 is past any length)


class LognormalLength(Strict):
    """Lognormal with the given mean (tokens) and log-space sigma, rounded and clipped to [1, max].

    `mean_tokens` is the mean after rounding and clipping, summed over the integer support
    (exactly up to 10^6 tokens of it; past that the closed form of `clipped_mean_tokens`,
    within half a token), so that it is the theory a sample mean converges to.
    """

    kind: Literal["lognormal"]
    mean: PositiveFloat
    # Far above any length distribution's (ShareGPT's prompts: about 1): at 1.35e154 its
    # square overflowed a float (a traceback from validate).
    sigma: Annotated[PositiveFloat, Field(le=MAX_SIGMA)]
    max: TokenCount

    def _mu(self) -> float:
        # E[X] = exp(mu + sigma^2 / 2) for the unclipped lognormal.
        return math.log(self.mean) - self.sigma**2 / 2.0

    def mean_tokens(self) -> float:
        # Beyond exp(mu + 9 sigma) lies under 1e-19 of the mass: the sum stops there (that
        # mass counted at `max`, 1e-10 tokens at most), or, where even that is too long a
        # support, the closed form (within half a token) takes over.
        last = min(self.max, math.ceil(math.exp(min(self._mu() + 9.0 * self.sigma, 700.0))))
        if last > EXACT_MEAN_SUPPORT:
            return self.clipped_mean_tokens()
        k = np.arange(1, last + 1, dtype=np.float64)
        cdf = _lognorm_cdf(k + 0.5, self._mu(), self.sigma)
        upper = np.append(cdf[:-1], 1.0) if last == self.max else cdf
        lower = np.insert(upper[:-1], 0, 0.0)
        return float(np.sum(k * (upper - lower))) + (1.0 - upper[-1]) * self.max

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        check_rng(rng)
        x = rng.lognormal(self._mu(), self.sigma, size=n)
        return np.clip(np.rint(x), 1, self.max).astype(np.int64)

    def clipped_mean_tokens(self) -> float:
        """The mean after clipping to [1, max], before rounding (which moves it by at most
        half a token): closed form, cheap at any `max`. With Φ the normal CDF,
        E[min(max(X, 1), M)] = P(X <= 1) + e^(mu + sigma²/2) [Φ(b - sigma) - Φ(a - sigma)]
        + M (1 - Φ(b)), a = (ln 1 - mu) / sigma, b = (ln M - mu) / sigma."""
        mu, sigma = self._mu(), self.sigma
        a, b = -mu / sigma, (math.log(self.max) - mu) / sigma
        inside = self.mean * (_normal_cdf(b - sigma) - _normal_cdf(a - sigma))
        return _normal_cdf(a) + inside + self.max * (1.0 - _normal_cdf(b))


def _normal_cdf(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def _lognorm_cdf(x: np.ndarray, mu: float, sigma: float) -> np.ndarray:
    z = (np.log(x) - mu) / (sigma * math.sqrt(2.0))
    return 0.5 * (1.0 + np.vectorize(math.erf)(z))


class EmpiricalLength(Strict):
    """Resampled with replacement from one column of a CSV file of lengths."""

    kind: Literal["empirical"]
    path: DataPath
    column: str

    def values(self) -> np.ndarray:
        return load_length_column(self.path, self.column)

    def mean_tokens(self) -> float:
        return float(self.values().mean())

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        check_rng(rng)
        return self.values()[self.sample_rows(rng, n)]

    def sample_rows(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """The rows `sample` draws (with replacement), for a column drawn beside it."""
        check_rng(rng)
        return rng.integers(0, len(self.values()), size=n)


def sample_prompt_and_output(prompt: LengthDist, output: LengthDist, rng: np.random.Generator,
                             n: int, answers: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """`n` prompt lengths and `n * answers` output lengths, prompt i's answers at
    `i * answers` on (a fan-out answers one message `answers` times). Two columns of one file
    are drawn as rows, as the conversations it measured paired them (drawn apart, ShareGPT's
    prompt and answer lengths lost their pairing; a tester's finding): each prompt's first
    answer is its row's, the others rows of their own. With one answer the prompts are the
    draws `prompt.sample` makes. One file however spelled ('d/../f.csv', a link); one column
    for both is no pair, drawn apart."""
    if isinstance(prompt, EmpiricalLength) and isinstance(output, EmpiricalLength) \
            and prompt.column != output.column \
            and resolve_data_path(prompt.path).resolve() == resolve_data_path(output.path).resolve():
        rows = prompt.sample_rows(rng, n * answers)
        return prompt.values()[rows[::answers]], output.values()[rows]
    return prompt.sample(rng, n), output.sample(rng, n * answers)


LengthDist = Annotated[
    ConstantLength | UniformLength | LognormalLength | EmpiricalLength,
    Field(discriminator="kind"),
]


def bad_lengths(values: np.ndarray) -> np.ndarray:
    """Which of `values` (float64) are not whole token counts in [1, MAX_LENGTH_TOKENS]."""
    return (~np.isfinite(values) | (values < 1) | (values > MAX_LENGTH_TOKENS)
            | (values != np.floor(values)))


def load_length_column(path: str, column: str) -> np.ndarray:
    """Read one positive integer column of a CSV; errors name the file, column and line."""

    # Read again when the file changes (a cache by path alone served an edited file stale);
    # the array is shared, read-only.
    resolved = resolve_data_path(path)
    return read_once(resolved, ("length column", column), lambda: _read_column(path, resolved, column),
                     copy_out=lambda values: values)


def _read_column(path: str, resolved: Path, column: str) -> np.ndarray:
    header = read_csv(resolved, nrows=0).columns
    if column not in header:
        raise ScenarioError(f"{path}: no column '{column}'; columns are {shown_columns(list(header), joined=True)}")
    # As text, so that an error quotes the value as written ('abc', '0'), and a non-number is
    # named rather than failing the conversion.
    # 'nan' or 'NA' quoted as written, not as pandas' missing value (a trace's reader too).
    values = read_csv(resolved, usecols=[column], dtype=str, keep_default_na=False,
                      na_values=[""])[column]
    if values.empty:  # nothing to resample from
        raise ScenarioError(f"{path}: column '{column}' has no rows; expected at least one "
                            f"length, {LENGTH_EXPECTED}")
    lengths = _positive_ints(values, resolved, column)
    lengths.flags.writeable = False
    return lengths


def _positive_ints(values: pd.Series, path: Path, column: str) -> np.ndarray:
    as_float = pd.to_numeric(values, errors="coerce").to_numpy(dtype=np.float64)
    bad = bad_lengths(as_float)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raw = values.iloc[row]
        shown = repr(raw) if isinstance(raw, str) else "(empty)"  # pandas reads '' as NaN
        raise ScenarioError(f"{path.name} line {csv_data_line(path, row)}: column '{column}' = "
                            f"{shown}, expected {LENGTH_EXPECTED}")
    return as_float.astype(np.int64)
