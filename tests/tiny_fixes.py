"""`make_tiny` with a working tiny RoBERTa (the shared fixture gives it GPT-2's pad id 50256,
which RoBERTa also uses as the padding_idx of its 66-row position table, so it cannot be built).

Here the tiny RoBERTa gets pad id 1, as roberta-base has, and its tokenizer pads with id 1.
"""

from __future__ import annotations

import torch
from conftest import make_tiny, tiny_config


def make_tiny_fixed(family: str, seed: int = 0, **overrides):
    if family != "roberta":
        return make_tiny(family, seed, **overrides)
    import transformers

    from pecli.architectures import ARCHITECTURES
    from pecli.loading import LoadedModel

    base = make_tiny("gpt2")  # for its tokenizer
    tokenizer = base.tokenizer
    tokenizer.pad_token = tokenizer.convert_ids_to_tokens(1)
    config = tiny_config("roberta", vocab_size=len(tokenizer), pad_token_id=1, **overrides)
    torch.manual_seed(seed)
    model = transformers.AutoModel.from_config(config).eval()
    return LoadedModel(model, tokenizer, ARCHITECTURES.get("roberta"), "tiny:roberta",
                       "tiny:roberta", "random", f"seed:{seed}", torch.device("cpu"), torch.float32)
