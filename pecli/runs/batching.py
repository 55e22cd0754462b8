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


CUDA_BYTES_PER_TOKEN = 256 * 1024  # rough activation memory per padded token (a 7B model's
# hidden states, MLP and LM-head chunk in fp32 with headroom); an overshoot is caught below

# Padded tokens per pass on CPU. A linear layer's rows are the batch's padded tokens; on a
# 2-core CPU, 256-1024 rows ran at 130-150 GFLOP/s (the activations stay in cache: 512 x 1536
# floats are 3 MB) and 2048-4096 rows at 100-125, with more padding too (docs/speed.md).
CPU_TOKEN_BUDGET = 4096  # LM scoring: SmolLM2's perplexity and mc were 0-10 % slower at 512
CPU_HIDDEN_STATE_BUDGET = 512  # hidden-state loops: ablate on IMDB 1.02-1.08x its speed at 4096


def default_token_budget(device: torch.device, cpu: int = CPU_TOKEN_BUDGET) -> int:
    """Padded tokens per forward pass: `cpu` on CPU; on CUDA half the free device memory over
    CUDA_BYTES_PER_TOKEN, between 2,048 and 262,144 (an out-of-memory error still halves a
    batch: `halving_on_oom`)."""
    if device.type != "cuda":
        return cpu
    free, _ = torch.cuda.mem_get_info(device)
    return int(min(max(free // 2 // CUDA_BYTES_PER_TOKEN, 2048), 262_144))


def halving_on_oom(compute, batch: list[int]) -> list:
    """`[compute(batch)]`, or when it runs out of device memory (torch.OutOfMemoryError), the
    results of its two halves in order (recursively; a single text that does not fit fails).

    Batches done before are kept by the caller; each split is counted in the rows'
    provenance (`oom_splits`) and logged on stderr.
    """
    import sys

    from pecli.runs.provenance import RUN_NOTES

    try:
        return [compute(batch)]
    except torch.OutOfMemoryError:
        if len(batch) == 1:
            raise
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    RUN_NOTES["oom_splits"] = RUN_NOTES.get("oom_splits", 0) + 1
    half = len(batch) // 2
    print(f"out of device memory on a batch of {len(batch)}: retrying as {half} + "
          f"{len(batch) - half}", file=sys.stderr)
    return halving_on_oom(compute, batch[:half]) + halving_on_oom(compute, batch[half:])


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


def tight_batches(lengths: list[int], token_budget: int, max_waste: float = 0.15,
                  min_tokens: int = 256) -> list[list[int]]:
    """Length-sorted batches within `token_budget` padded tokens that also bound padding.

    `length_batches` alone puts 64 questions of 5-33 tokens in one batch padded to 33 (2.3x
    the real tokens). Here a batch is also closed when the next text would make more than
    `max_waste` of it padding, once it holds `min_tokens` real tokens (tiny batches cost
    more in per-pass overhead than they save).
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])  # longest first
    batches: list[list[int]] = []
    current: list[int] = []
    real = 0
    for i in order:
        if current:
            longest = lengths[current[0]]
            padded = (len(current) + 1) * longest
            waste = 1 - (real + lengths[i]) / padded
            if padded > token_budget or (waste > max_waste and real >= min_tokens):
                batches.append(current)
                current, real = [], 0
        current.append(i)
        real += lengths[i]
    if current:
        batches.append(current)
    return batches


def pad(seqs: list[list[int]], pad_id: int, device: torch.device, side: str = "right",
        width: int | None = None):
    """(input_ids[b, t], attention_mask[b, t]) padded on `side` to the longest sequence (or
    to `width`)."""
    longest = max(map(len, seqs)) if width is None else width
    ids = torch.full((len(seqs), longest), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), longest), dtype=torch.long)
    for row, seq in enumerate(seqs):
        span = slice(0, len(seq)) if side == "right" else slice(longest - len(seq), longest)
        ids[row, span] = torch.tensor(seq, dtype=torch.long)
        mask[row, span] = 1
    return ids.to(device), mask.to(device)


def padded_tokens(batches: list[list[int]], lengths: list[int]) -> list[int]:
    """Each batch's padded size: rows x longest."""
    return [len(b) * max(lengths[i] for i in b) for b in batches]


def plan_summary(padded: list[int], batch_size: int | None) -> dict:
    """The batch plan as rows and sidecars record it, from each forward batch's padded size
    (`padded_tokens`): `batch_size` as given ("token budget" when None), the number of
    `batches` of the whole run (before sharding across processes; a plan of fewer batches than
    processes is split first, `pecli.runs.parallel.spread`) and the largest, `max_batch_tokens`."""
    return {"batch_size": "token budget" if batch_size is None else batch_size,
            "batches": len(padded), "max_batch_tokens": max(padded, default=0)}
