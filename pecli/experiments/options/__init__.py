"""The options classes of the experiments whose modules import pandas or torch when imported,
one module each, named as the experiment's (`options.ablate` beside `pecli.experiments.ablate`):
the command line imports every options class for `--help`, which never loads pandas or torch.
A new experiment declares its options in its own module instead (pecli.experiments.ruler).

The bases are pecli.runs.options' (`Running`, `OnData`, `Masked`, ...) and
pecli.positions.rope_scaling's `RopeScaled`.
"""
