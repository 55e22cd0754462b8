"""The sinusoidal position encoding of Vaswani et al. (2017), pecli's one sinusoid: the
`sinusoidal` intervention, the `sinusoidal` training scheme and the PE analyses use it.

Pure numpy. Shapes are [positions, dim].
"""

from __future__ import annotations

import numpy as np

from pecli.runs.errors import ConfigError


def check_sinusoid_args(positions: int, dim: int, base: float) -> None:
    """A ConfigError naming the fix for sizes the encoding does not define."""
    if positions < 1:
        raise ConfigError(f"--positions must be at least 1 (got {positions})")
    if dim < 2 or dim % 2:
        raise ConfigError(f"--dim must be a positive even number: dimensions come in (sin, cos) "
                          f"pairs (got {dim})")
    if not base > 1:
        raise ConfigError(f"--base must be greater than 1 (got {base}); the usual value is 10000")


def frequencies(dim: int, base: float = 10000.0) -> np.ndarray:
    """Angular frequency of each (sin, cos) pair: w_i = base^(-2i/dim), shape [dim/2]."""
    return base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)


def sinusoidal_at(pos: np.ndarray, dim: int, base: float = 10000.0) -> np.ndarray:
    """PE at arbitrary (even negative or fractional) positions `pos` [n] -> [n, dim] float64.

    The one sinusoid of pecli: the `sinusoidal` intervention and training scheme use it too.
    An odd `dim` keeps ceil(dim/2) frequencies and drops the last cos.
    """
    angles = np.asarray(pos, dtype=np.float64)[:, None] * frequencies(dim, base)[None, :]  # [n, ceil(dim/2)]
    pe = np.empty((angles.shape[0], dim))
    pe[:, 0::2] = np.sin(angles)
    pe[:, 1::2] = np.cos(angles)[:, : dim // 2]
    return pe


def sinusoidal(positions: int, dim: int, base: float = 10000.0) -> np.ndarray:
    """The encoding of positions 0..positions-1: PE[pos, 2i] = sin(pos w_i), PE[pos, 2i+1] = cos(pos w_i)."""
    check_sinusoid_args(positions, dim, base)
    return sinusoidal_at(np.arange(positions), dim, base)


def sinusoid_like(positions: int, dim: int) -> np.ndarray:
    """The sinusoidal matrix of a model table's shape [positions, dim], the reference of
    pe probe and pe recover (an odd width: the even encoding one wider, its last cos dropped)."""
    return sinusoidal(positions, dim + dim % 2)[:, :dim]
