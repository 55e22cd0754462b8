"""Tokenise once, then batch by length so padding (wasted compute) stays small."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Encoded:
    ids: list[list[int]]  # token ids per text, after truncation
    truncated: int  # how many texts were cut to max_length

    @property
    def tokens(self) -> int:
        return sum(map(len, self.ids))


def encode(tokenizer, texts: list[str], max_length: int, add_special_tokens: bool = True) -> Encoded:
    """Tokenise every text once; cut texts longer than `max_length` tokens and count them."""
    ids = tokenizer(texts, add_special_tokens=add_special_tokens, truncation=False)["input_ids"]
    truncated = sum(len(x) > max_length for x in ids)
    if truncated and add_special_tokens and getattr(tokenizer, "sep_token_id", None) is not None \
            and ids[0] and ids[0][-1] == tokenizer.sep_token_id:
        # Keep the closing [SEP] an encoder expects.
        ids = [x if len(x) <= max_length else x[: max_length - 1] + x[-1:] for x in ids]
    else:
        ids = [x[:max_length] for x in ids]
    return Encoded(ids, truncated)


def default_token_budget(device: torch.device) -> int:
    """Padded tokens per forward pass: small batches on CPU (no gain past a few thousand)."""
    return 32768 if device.type == "cuda" else 4096


def length_batches(lengths: list[int], token_budget: int, max_batch: int | None = None) -> list[list[int]]:
    """Indices grouped into batches of similar length.

    Texts are sorted by length (longest first, so memory peaks early) and cut into batches
    whose padded size `len(batch) * longest` stays within `token_budget`, or of at most
    `max_batch` texts when that is given.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        longest = lengths[current[0]] if current else lengths[i]
        full = (len(current) + 1) * longest > token_budget if max_batch is None else len(current) == max_batch
        if current and full:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def pad(seqs: list[list[int]], pad_id: int, device: torch.device, side: str = "right"):
    """(input_ids[b, t], attention_mask[b, t]) padded on `side` to the longest sequence."""
    longest = max(map(len, seqs))
    ids = torch.full((len(seqs), longest), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), longest), dtype=torch.long)
    for row, seq in enumerate(seqs):
        span = slice(0, len(seq)) if side == "right" else slice(longest - len(seq), longest)
        ids[row, span] = torch.tensor(seq, dtype=torch.long)
        mask[row, span] = 1
    return ids.to(device), mask.to(device)
