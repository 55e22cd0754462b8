"""What pecli does to position information: interventions on a model's positions (zero,
shuffle, swap, ...), graded attention masks in place of positions, the sinusoidal encoding,
and rope scaling.

May import pecli.models, pecli.data and pecli.runs.
"""
