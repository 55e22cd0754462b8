"""pecli inside other tools: the lm-evaluation-harness model `pecli` (lm_eval.py).

A bridge takes another tool's requests and answers them with pecli's models and conditions
(interventions, masks, rope scaling), so the tool's own metrics score them.

Sits between the shell and the experiments: may import pecli.experiments and every layer
below it; pecli.cli imports it.
"""
