"""Figures from written CSVs: pandas and matplotlib only, never torch.

May import pecli.positions (the sinusoid drawn beside a model's table) and pecli.runs; never
pecli.measures, so that drawing a figure never needs a model.
"""

import matplotlib

matplotlib.use("Agg")
