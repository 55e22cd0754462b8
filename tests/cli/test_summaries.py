"""What a printed summary shows: one count of decimals per column, enough for a small effect."""

from __future__ import annotations

import math

from pecli.runs.numbers import decimals, number


def test_decimals_show_a_small_effect_and_line_up_a_column():
    # a cosine of 1 - 1e-5 with its interval is not 1.0000 [1.0000, 1.0000]
    d = decimals([0.99999], [0.999985], [0.999995])
    assert f"{0.99999:.{d}f}" != "1.0000" and f"{0.999985:.{d}f}" != f"{0.999995:.{d}f}"
    assert f"{0.9999873:.{decimals([0.9999873])}f}" != "1.0000"  # no interval: its distance to 1
    # a std of 6e-6 is not 0.0000
    assert float(f"{6e-6:.{decimals([6e-6])}f}") != 0
    # one count for the column: 38.4 and 46.12 get the same number of decimals
    d = decimals([38.4, 41.8], [33.16, 37.27], [46.12, 47.57])
    assert d == 2 and number(38.4, d) == "38.40" and number(1650.637, d) == "1,650.64"
    assert decimals([0.3, 0.5155], [0.22, 0.43], [0.39, 0.60]) == 4
    assert decimals([math.nan]) == 4 and decimals([]) == 4
