"""Everything around a run: validated options and the names they use, preset files, output
folders (locks, staging, atomic writes), tables, provenance, progress, processes, batching,
errors and the generic registry.

The bottom layer: it imports nothing else of pecli. Several of its modules (names, options,
config, io, tables) never import torch, so that a bad option fails in a fraction of a second.
"""
