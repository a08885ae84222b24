"""edgesdk.numbers.is_number: the one test of "a number" the device side uses (manifest schema, preprocess)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgesdk.numbers import is_number


@pytest.mark.parametrize("value", [0, 1, -7, 1.5, -0.0, 10**30, np.float64(2.5)])
def test_ints_and_floats_are_numbers(value):
    assert is_number(value)
    assert is_number(value, finite=False)


@pytest.mark.parametrize("value", [True, False, np.bool_(True)])
def test_a_bool_is_not_a_number(value):
    assert not is_number(value)
    assert not is_number(value, finite=False)


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, np.float64("inf"), np.float64("nan")])
def test_infinity_and_nan_are_numbers_only_when_not_finite_is_asked(value):
    assert not is_number(value)
    assert is_number(value, finite=False)


@pytest.mark.parametrize("value", [np.float32(1.5), np.int64(3), np.int32(0), np.array(1.0), np.array([1.0])])
def test_numpy_scalars_other_than_float64_are_not_numbers(value):
    assert not is_number(value)
    assert not is_number(value, finite=False)


@pytest.mark.parametrize("value", ["1", "1.5", "inf", b"1", None, [1], (1,), 1j])
def test_strings_and_other_values_are_not_numbers(value):
    assert not is_number(value)
    assert not is_number(value, finite=False)
