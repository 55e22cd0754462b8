"""Token NLLs of a causal LM under a mask protocol (study E2, E3).

Texts are tokenised once (no special tokens, as `evaluate` does), an optional start
token is prepended, then cut into *windows* of at most the model's positions
(`windows_for`). Each window scores targets ids[t] for t >= window.first. How each
condition is computed is decided once, by `plan` (a `Plan`: the condition's names, the
attention to install, the passes), and handed down to `score`. Two protocols:

- `relative`: one pass per window (batched); query i weighs key k by m(i, k) over its own
  prefix. `fast=False` computes the same numbers with one pass per prefix (the identity
  the tests check and the benchmark times).
- `study`: one pass per predicted position over the prefix ids[:t], every row of that pass
  weighing keys by m(t, .) as one 1-D mask does, scoring only the last row. Prefixes of
  all texts are batched by length (left padding, so the scored row is the last column).
  Under `legacy` with a mask rising towards the newest key, every row then attends only
  to itself, so the whole protocol equals one pass with a self-only mask: its fast path.

The mask `default` (m = 1) is the identity under every semantics and protocol, and so is
`boolean` with a mask that is positive on every key (it only asks "m != 0?"): both run the
model unchanged, so `--mask default` is plain evaluation, bit for bit. `fast=False` skips
every shortcut; the tests check each shortcut against it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from pecli.measures.metrics import head_nll

# a condition and how it is computed (its plan) are pecli.positions.conditions'
from pecli.positions.conditions import Condition as Plan
from pecli.positions.conditions import check_causal, installed, plan
from pecli.runs import names, parallel
from pecli.runs.batching import (
    default_token_budget,
    length_batches,
    pad,
    padded_tokens,
    plan_summary,
    tight_batches,
)
from pecli.runs.errors import ConfigError, DataError
from pecli.runs.loop import run_batches


@dataclass(frozen=True)
class Window:
    text: int  # index of the text it belongs to
    ids: list[int]  # model input, at most max_positions tokens
    first: int  # first scored target: ids[t] for first <= t < len(ids), predicted from ids[:t]

    @property
    def targets(self) -> int:
        return max(len(self.ids) - self.first, 0)


@dataclass
class Prepared:
    """What to score, shared by every condition of a run (one tokenisation)."""

    windows: list[Window]
    texts: int
    truncated: int  # texts longer than max_positions (cut, or split into windows)
    dropped_tokens: int  # tokens never scored because of truncation
    start_token: str  # "bos" (prepended, first token scored) or "none"
    long_text: str
    stride: int | None

    @property
    def tokens(self) -> int:
        """Scored targets."""
        return sum(w.targets for w in self.windows)

    @property
    def prefixes(self) -> int:
        """Forward sequences the study protocol needs without its fast path."""
        return self.tokens


def windows_for(ids: list[list[int]], max_positions: int, bos_id: int | None,
                long_text: str = "truncate", stride: int | None = None) -> Prepared:
    """The windows to score over token ids (one list per text, no special tokens).

    Args:
        ids: token ids per text.
        max_positions: the model's longest sequence.
        bos_id: prepend this start token and score the first real token too (`evaluate`'s
            add_start_token=True), or None to score from the second token.
        long_text: "truncate" (keep the first max_positions tokens, start token included,
            as `evaluate` does) or "window" (sliding windows of max_positions moving by
            `stride`; each target is scored once, with the longest context its window gives).
        stride: window step (default max_positions // 2); only with "window".
    """
    long_text = str(long_text)  # a name of pecli.runs.names.LONG_TEXT (or its Choice)
    names.LONG_TEXT.get(long_text)
    if long_text == "window":
        stride = max(max_positions // 2, 1) if stride is None else stride
        if not 0 < stride <= max_positions:
            raise ConfigError(f"--stride must be between 1 and the model's {max_positions} positions (got {stride})")
    elif stride is not None:
        raise ConfigError("--stride only applies with --long-text window")
    windows, truncated, dropped = [], 0, 0
    for i, text in enumerate(ids):
        seq = ([bos_id] if bos_id is not None else []) + list(text)
        if len(seq) > max_positions:
            truncated += 1
        if long_text == "truncate" or len(seq) <= max_positions:
            dropped += max(len(seq) - max_positions, 0)
            windows.append(Window(i, seq[:max_positions], 1))
            continue
        prev_end = 0
        for begin in range(0, len(seq), stride):
            end = min(begin + max_positions, len(seq))
            # score only targets past the previous window's end, each with its longest context
            windows.append(Window(i, seq[begin:end], max(prev_end - begin, 1)))
            prev_end = end
            if end == len(seq):
                break
    return Prepared(windows, len(ids), truncated, dropped, "none" if bos_id is None else "bos",
                    long_text, stride if long_text == "window" else None)


def _position_ids(mask: torch.Tensor) -> torch.Tensor:
    # Positions count real tokens only, so a left-padded row starts at 0 like a right-padded one.
    return (mask.cumsum(-1) - 1).clamp(min=0)  # [b, t]


def _nll_at(loaded, ids: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor,
            targets: torch.Tensor) -> torch.Tensor:
    """NLL of `targets[n]` predicted at (rows[n], cols[n]) of one padded batch ids[b, t]."""
    hidden = loaded.model.base_model(input_ids=ids, attention_mask=mask,
                                     position_ids=_position_ids(mask),
                                     use_cache=False).last_hidden_state  # [b, t, d]
    return head_nll(loaded.model, hidden[rows, cols], targets)  # only scored rows meet the head


def _batches(lengths: list[int], batch_size: int | None, device: torch.device) -> list[list[int]]:
    if batch_size is not None and batch_size < 1:
        raise ConfigError(f"--batch-size must be at least 1 (got {batch_size})")
    if batch_size is not None:
        return length_batches(lengths, 0, max_batch=batch_size)
    return tight_batches(lengths, default_token_budget(device))  # padding bounded (short texts)


def _prefix_jobs(windows: list[Window]) -> list[tuple[int, int]]:
    # (window, t): one pass over windows[window].ids[:t] per scored target t
    return [(wi, t) for wi, w in enumerate(windows) for t in range(w.first, len(w.ids))]


def batch_plan(loaded, windows: list[Window], passes: str, batch_size: int | None = None) -> dict:
    """The batches `score_windows` (passes "one-pass") or `score_prefixes` plan for these
    windows, summarised (`pecli.runs.batching.plan_summary`): the same on any number of processes."""
    lengths = ([len(w.ids) for w in windows] if passes == "one-pass"
               else [t for _, t in _prefix_jobs(windows)])
    return plan_summary(padded_tokens(_batches(lengths, batch_size, loaded.device), lengths), batch_size)


def score_windows(loaded, windows: list[Window], *, batch_size: int | None = None, side: str = "right",
                  progress: Callable[[int], None] | None = None) -> list[torch.Tensor]:
    """One pass per window (under whatever attention the model is set to): NLL [targets] per window.

    Launched on N processes, each scores its shard of the batches (`pecli.runs.loop`)."""
    lengths = [len(w.ids) for w in windows]

    def one(batch: list[int], width: int) -> torch.Tensor:  # NLL [targets of the batch's windows]
        ids, mask = pad([windows[i].ids for i in batch], loaded.tokenizer.pad_token_id, loaded.device,
                        side, width)  # [b, t]
        rows, cols, tgt = [], [], []
        for r, i in enumerate(batch):
            w, shift = windows[i], (width - len(windows[i].ids) if side == "left" else 0)
            ts = list(range(w.first, len(w.ids)))
            rows += [r] * len(ts)
            cols += [shift + t - 1 for t in ts]  # the row before target t predicts it
            tgt += [w.ids[t] for t in ts]
        return _scored(loaded, ids, mask, rows, cols, tgt, progress)

    batches, done = run_batches(_batches(lengths, batch_size, loaded.device), lengths, one)
    out: list[torch.Tensor | None] = [None] * len(windows)
    for b, nll in done.items():
        for i, part in zip(batches[b], nll.split([windows[i].targets for i in batches[b]]), strict=True):
            out[i] = part
    return out


def score_prefixes(loaded, windows: list[Window], *, batch_size: int | None = None,
                   progress: Callable[[int], None] | None = None) -> list[torch.Tensor]:
    """One pass per scored target over its prefix ids[:t], scoring the last row only."""
    jobs = _prefix_jobs(windows)
    lengths = [t for _, t in jobs]

    def one(batch: list[int], width: int) -> torch.Tensor:  # NLL [b]
        seqs = [windows[jobs[j][0]].ids[: jobs[j][1]] for j in batch]
        ids, mask = pad(seqs, loaded.tokenizer.pad_token_id, loaded.device, "left", width)  # [b, t]
        tgt = [windows[jobs[j][0]].ids[jobs[j][1]] for j in batch]
        return _scored(loaded, ids, mask, list(range(len(batch))), [width - 1] * len(batch), tgt,
                       progress)  # left padding: the scored row is the last column

    batches, done = run_batches(_batches(lengths, batch_size, loaded.device), lengths, one)
    nll = torch.empty(len(jobs))
    for b, part in done.items():
        nll[batches[b]] = part
    counts = [w.targets for w in windows]
    return list(nll.split(counts))


def _scored(loaded, ids, mask, rows: list[int], cols: list[int], targets: list[int],
            progress: Callable[[int], None] | None) -> torch.Tensor:
    """NLL [n] on the CPU of targets[n] predicted at (rows[n], cols[n]) of a padded batch;
    `progress` is told of the n targets."""
    dev = loaded.device
    nll = _nll_at(loaded, ids, mask, torch.tensor(rows, dtype=torch.long, device=dev),
                  torch.tensor(cols, dtype=torch.long, device=dev),
                  torch.tensor(targets, dtype=torch.long, device=dev)).cpu()
    if progress:
        progress(len(targets))
    return nll


def score(loaded, prepared: Prepared, how: Plan | str = "default", semantics: str = "legacy",
          protocol: str = "relative", *, fast: bool = True, batch_size: int | None = None,
          side: str = "right", progress: Callable[[int], None] | None = None
          ) -> tuple[list[torch.Tensor], Plan]:
    """Per-text NLLs ([n_i] each, windows of a text concatenated) and the plan they followed.

    `how`: the condition's Plan (the experiments build one per condition), or a mask name with
    `semantics`, `protocol` and `fast`, planned here (tests, benchmarks). `fast=False` takes
    the slow, literal route (no default-mask shortcut, prefix by prefix for both protocols):
    the identities the tests check compare the two.
    """
    check_causal(loaded)
    if not isinstance(how, Plan):
        how = plan(how, semantics, protocol, fast=fast)
    with torch.inference_mode(), installed(loaded, how):
        if how.passes == "one-pass":
            per_window = score_windows(loaded, prepared.windows, batch_size=batch_size, side=side,
                                       progress=progress)
        else:
            per_window = score_prefixes(loaded, prepared.windows, batch_size=batch_size, progress=progress)
    per_text: list[list[torch.Tensor]] = [[] for _ in range(prepared.texts)]
    for w, nll in zip(prepared.windows, per_window, strict=True):
        per_text[w.text].append(nll)
    return [torch.cat(parts) if parts else torch.empty(0) for parts in per_text], how


# --- resuming: each finished computation's NLLs, saved (pecli.runs.io.Checkpoint) ----------


def saved_nlls(done: dict) -> dict:
    """NLLs per computation as flat arrays + per-text lengths, keys as JSON strings: what a
    pecli.runs.io.Checkpoint saves (perplexity, length); `resumed_nlls` reads it back."""
    out = {"keys": np.array([json.dumps(list(k)) for k in done])}
    for j, nlls in enumerate(done.values()):
        out[f"nll{j}"] = torch.cat(nlls).cpu().numpy() if nlls else np.zeros(0)
        out[f"len{j}"] = np.array([x.numel() for x in nlls], dtype=np.int64)
    return out


def resumed_nlls(checkpoint) -> dict:
    """What `saved_nlls` saved, on every process: launched on N processes, the main one alone
    reads (and so locks and saves) the checkpoint."""
    return parallel.from_main(_read_nlls(checkpoint) if parallel.is_main() else {})


def _read_nlls(checkpoint) -> dict:
    saved = checkpoint.load()
    if saved is None:
        return {}
    done = {}
    for j, key in enumerate(saved["keys"]):
        flat, lengths = torch.from_numpy(saved[f"nll{j}"]), saved[f"len{j}"].tolist()
        done[tuple(json.loads(str(key)))] = list(torch.split(flat, lengths))
    return done


def start_token(loaded, wanted: bool, instead: str) -> int | None:
    """The start token to prepend (`windows_for`'s bos_id) when `wanted`, else None; a
    tokenizer without one is refused, saying what to do `instead`."""
    if not wanted:
        return None
    bos = loaded.tokenizer.bos_token_id
    if bos is None:
        raise DataError(f"{loaded.name}'s tokenizer has no start token; {instead}")
    return bos
