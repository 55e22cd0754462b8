"""How a column of numbers is printed: one count of decimals for all of it (no heavy imports:
the commands import it at start)."""

from __future__ import annotations

import math


def decimals(values, lows=(), highs=(), most: int = 7) -> int:
    """One number of decimals for a whole column, so that its numbers line up: 4 (2 where
    values reach 10 or more), more where the narrowest interval (two significant digits) or
    the smallest value (three) or a value's distance to the nearest integer (two) needs them,
    so that a small effect, a cosine of 1 - 1e-5, is not printed as 1.0000 [1.0000, 1.0000].
    At most `most`."""
    finite = [abs(float(x)) for x in values if x == x and abs(float(x)) != math.inf]
    widths = [float(h) - float(lo) for lo, h in zip(lows, highs, strict=False)
              if lo == lo and h == h and float(h) - float(lo) > 0]
    need = 4 if not finite or max(finite) < 10 else 2
    if widths:
        need = max(need, math.ceil(-math.log10(min(widths))) + 1)
    small = [x for x in finite if 0 < x < 1]
    if small:
        need = max(need, math.ceil(-math.log10(min(small))) + 2)
    near = [abs(x - round(x)) for x in finite if 0 < abs(x - round(x)) < 0.01]  # 0.99999, not 1.0000
    if near:
        need = max(need, math.ceil(-math.log10(min(near))) + 1)
    return int(min(most, need))


def number(x: float, digits: int) -> str:
    """`12,345.68`: thousands separated, `digits` decimals (the column's, from `decimals`)."""
    return f"{x:,.{digits}f}"
