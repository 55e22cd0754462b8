"""Figures from written CSVs: pandas and matplotlib only, never torch."""

import matplotlib

matplotlib.use("Agg")
