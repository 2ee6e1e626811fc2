"""orcasim.portable: numpy's elementwise pow, exp and log by the C library's functions, so that
a result has the same bits on a CPU with AVX-512 and on one without (numpy's SIMD code and
libm differ in the last bit for some inputs). Whether numpy differs here depends on the CPU;
what these functions promise does not: each element is `math`'s, in the input's shape."""

from __future__ import annotations

import math

import numpy as np
import pytest

from orcasim.portable import libm_exp, libm_log, libm_power


def _bits(values: np.ndarray) -> list[int]:
    return values.astype(np.float64).view(np.int64).ravel().tolist()


@pytest.mark.parametrize("seed", [0, 1])
def test_each_element_is_the_c_librarys_in_the_inputs_shape(seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-30.0, 30.0, size=(7, 13))
    positive = rng.uniform(1e-6, 10.0, size=(5, 3))  # to the 64th: no overflow
    exponent = rng.uniform(0.0, 64.0, size=(5, 3))
    cases = [
        (libm_exp(x), np.array([[math.exp(v) for v in row] for row in x])),
        (libm_log(positive), np.array([[math.log(v) for v in row] for row in positive])),
        (libm_power(positive, exponent),
         np.array([[math.pow(b, e) for b, e in zip(rb, re, strict=True)]
                   for rb, re in zip(positive, exponent, strict=True)])),
    ]
    for got, expected in cases:
        assert got.shape == expected.shape and got.dtype == np.float64
        assert _bits(got) == _bits(expected)


def test_a_scalar_broadcasts_and_a_scalar_alone_is_a_zero_dimensional_array() -> None:
    base = np.array([0.5, 0.25, 0.125])
    assert _bits(libm_power(base, 3)) == _bits(np.array([math.pow(b, 3) for b in base]))
    assert _bits(libm_power(0.5, np.array([1.0, 2.0]))) == _bits(np.array([0.5, 0.25]))
    alone = libm_exp(1.0)
    assert alone.shape == () and float(alone) == math.exp(1.0)


def test_exp_overflows_to_infinity_as_numpy_does_and_underflows_to_zero() -> None:
    """math.exp raises OverflowError where numpy gives inf; libm_exp gives inf."""
    with np.errstate(over="ignore"):
        assert np.isinf(np.exp(1000.0))
    got = libm_exp(np.array([1000.0, -1000.0, 0.0]))
    assert got.tolist() == [math.inf, 0.0, 1.0]


def test_log_of_zero_raises_where_numpy_would_give_minus_infinity() -> None:
    """Documented: positive inputs only (every caller clips or starts at 1)."""
    with pytest.raises(ValueError):
        libm_log(np.array([1.0, 0.0]))


def test_a_power_that_overflows_raises() -> None:
    """Documented: for powers that cannot overflow (of a probability); a guard would cost
    every element of a MoE iteration's hundreds a call."""
    with pytest.raises(OverflowError):
        libm_power(np.array([10.0]), 400.0)
