"""The science: cosine and probe metrics, bootstrap intervals, language-model scoring (windows,
prefixes, masked one-pass evaluation), multiple-choice scoring, PE analyses, position recovery,
and the loops that train small models.

May import pecli.positions, pecli.models, pecli.data and pecli.runs; never pecli.plots.
"""
