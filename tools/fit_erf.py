#!/usr/bin/python3
"""Fits the coefficients of kernels::erf_vectorisable (kernels/elementwise.h).

erf(x) = x + x * P(x^2) on [0, 0.921875] (P of degree 5) and erf(x) = 1 - exp(-Q(x)) on
[0.921875, 4] (Q of degree 8): weighted least squares on Chebyshev-spaced points against
mpmath's erf at 40 digits, weights making the residual the relative error of erf. The float
coefficients it prints are the ones in the header; tests/kernels/elementwise_test.cc checks the
result (<= 1.25 ulp over [0, 8])."""

import mpmath
import numpy as np

mpmath.mp.dps = 40
SPLIT, TOP, N = 0.921875, 4.0, 4000


def fit(points, target, weight, degree):
    basis = np.vander(points, degree + 1, increasing=True) * weight[:, None]
    coefficients, *_ = np.linalg.lstsq(basis, target * weight, rcond=None)
    return coefficients


def chebyshev(lo, hi):
    return lo + (hi - lo) * (0.5 - 0.5 * np.cos(np.linspace(0, np.pi, N)))


def main():
    x = chebyshev(0, SPLIT)[1:]
    erf = np.array([float(mpmath.erf(v)) for v in x])
    g = np.array([float((mpmath.erf(v) - v) / v) for v in x])
    p = fit(x * x, g, x / erf, 5)
    a = chebyshev(SPLIT, TOP)
    q_target = np.array([float(-mpmath.log(mpmath.erfc(v))) for v in a])
    weight = np.array([float(mpmath.erfc(v) / mpmath.erf(v)) for v in a])
    q = fit(a, q_target, weight, 8)
    print("P (x^0 first):", [repr(float(np.float32(c))) for c in p])
    print("Q (x^0 first):", [repr(float(np.float32(c))) for c in q])


if __name__ == "__main__":
    main()
