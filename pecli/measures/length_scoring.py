"""Loss by position and by window length over one token stream (`pecli length`).

The stream is cut into windows (`cut`), each scored in one pass (pecli.measures.lm_scoring's
`score_windows`: batched, halved on OOM, sharded over processes), or the whole stream is
scored in one band-masked pass (`score_band`). Either way the result is one NLL tensor per
window, over its scored targets, whose positions inside the window are known; `summarise`
turns them into rows by position bucket with a bootstrap over windows.

Window protocols (a window's input is at most L tokens; target t of a window is predicted
from the window's tokens before it, its position inside the window is t):
- nonoverlapping: windows [kL, (k+1)L) of the stream; targets 1..L-1 of each; the
  remainder shorter than L is dropped (and counted).
- sliding (stride S): windows start at 0, S, 2S, ...; each scores the targets past the
  previous window's end, so every stream token from the second on is scored once, with
  between L-S and L-1 tokens of context (Press et al. 2022's evaluation; S = 1: always L-1,
  past the first window). At S = L without a start token a window starts where the last
  ended, so its first token has no context and is not scored: those count as dropped_tokens.
- band: one pass over the stream in which each token attends to itself and its L-2
  predecessors (a band mask of width L-1, sliding-window attention). For a one-layer model
  whose attention depends only on query-key offsets this is `sliding` at stride 1 exactly;
  with more layers it is not: the key at position k then carries what k saw in the layer
  below, L-1 tokens back from k, not back to the window's start, so the receptive field
  grows by L-2 per layer. It is its own measure (the loss under sliding-window attention),
  computed at the cost of one pass.
With a start token, each window's input is the tokenizer's start token and L-1 stream tokens,
and its first stream token is scored too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from pecli.measures.intervals import MIN_WINDOWS, diff_columns, ratio_interval
from pecli.measures.lm_scoring import Window
from pecli.measures.metrics import head_nll
from pecli.runs.batching import encode
from pecli.runs.errors import ConfigError, DataError

BAND_TOKENS = 4096  # stream tokens of queries per band-pass chunk (its keys reach L-2 further back)


@dataclass
class Cut:
    """The windows of one length over one stream: where each starts, its input size, its
    first scored target (targets are positions first..size-1 of the window's input)."""

    length: int
    offsets: list[int]  # stream index of each window's first stream token
    sizes: list[int]  # model-input tokens of each window (start token included)
    firsts: list[int]
    lead: list[int]  # [start token id] or []
    dropped_tokens: int  # stream tokens no window scores (the nonoverlapping remainder)
    protocol: str
    stride: int | None

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def tokens(self) -> int:
        return sum(s - f for s, f in zip(self.sizes, self.firsts, strict=True))

    def positions(self) -> list[np.ndarray]:
        """Per window, the positions inside it of its scored targets."""
        return [np.arange(f, s) for f, s in zip(self.firsts, self.sizes, strict=True)]

    def windows(self, stream: list[int]) -> list[Window]:
        """As pecli.measures.lm_scoring windows (`text`: the window's index), for one pass each."""
        body = [s - len(self.lead) for s in self.sizes]
        return [Window(i, self.lead + stream[o:o + b], f)
                for i, (o, b, f) in enumerate(zip(self.offsets, body, self.firsts, strict=True))]

def stream_of(tokenizer, texts: list[str]) -> list[int]:
    """The documents' tokens (no special tokens) joined by the tokenizer's EOS, in order."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise DataError("the tokenizer has no EOS token to join documents with; pass a model "
                        "whose tokenizer has one")
    stream: list[int] = []
    for i, ids in enumerate(encode(tokenizer, texts, max_length=10**12, add_special_tokens=False).ids):
        stream += ([eos] if i else []) + list(ids)
    return stream


def cut(stream: list[int], length: int, protocol: str = "nonoverlapping",
        stride: int | None = None, start_token: int | None = None) -> Cut:
    """The windows of `length` model-input tokens over `stream` under `protocol`.

    start_token: an id prepended to every window (whose first stream token is then scored);
    None: none (the window's first token is context only)."""
    if length < 2:
        raise ConfigError(f"--lengths: a window of {length} token(s) has nothing to score; use 2 or more")
    lead = [] if start_token is None else [start_token]
    body = length - len(lead)  # stream tokens per window
    if protocol == "nonoverlapping":
        offsets = list(range(0, len(stream) - body + 1, body))
        return Cut(length, offsets, [length] * len(offsets), [1] * len(offsets), lead,
                   len(stream) - len(offsets) * body, protocol, None)
    if protocol not in ("sliding", "band"):
        raise ConfigError(f"--windows: unknown protocol {protocol!r}; use nonoverlapping, sliding or band")
    if protocol == "band" and (lead or stride not in (None, 1)):
        raise ConfigError("--windows band is one pass at stride 1 without a start token; "
                          "use --windows sliding for --stride or --start-token")
    stride = 1 if stride is None else stride
    if not 0 < stride <= body:
        raise ConfigError(f"--stride must be between 1 and the window's {body} stream tokens (got {stride})")
    offsets, sizes, firsts, prev_end = [], [], [], 0
    for begin in range(0, max(len(stream) - 1, 1), stride):
        end = min(begin + body, len(stream))
        offsets.append(begin)
        sizes.append(end - begin + len(lead))
        # targets past the previous window's end, each with its longest context
        firsts.append(max(prev_end - begin + len(lead), 1))
        prev_end = end
        if end == len(stream):
            break
    scored = sum(s - f for s, f in zip(sizes, firsts, strict=True))
    # every stream token from the second on (the first too, after a start token) is scored
    # once, except a window's first one when it starts where the last ended (S = L, no start
    # token): it has no context in its window, and is counted here
    dropped = len(stream) - (0 if lead else 1) - scored
    return Cut(length, offsets, sizes, firsts, lead, max(dropped, 0), protocol, stride)


def _band_mask(lo: torch.Tensor, n: int) -> torch.Tensor:
    """[1, 1, n, n] bool: query i sees keys lo[i] <= k <= i (lo relative to the chunk)."""
    k = torch.arange(n, device=lo.device)
    return ((k[None, :] >= lo[:, None]) & (k[None, :] <= k[:, None]))[None, None]


def score_band(loaded, stream: list[int], windows: Cut, *, chunk: int = BAND_TOKENS,
               progress: Callable[[int], None] | None = None) -> list[torch.Tensor]:
    """NLLs of `band` windows (stride 1, no start token) from band-masked passes over the stream.

    Query i (predicting stream token i+1) attends to keys max(i - (L-2), 0)..i. Queries go in
    chunks of `chunk` stream tokens, each chunk's input reaching L-2 tokens further back; the
    boolean mask is built once per chunk and shared by every layer (SDPA reads it as it is).
    Position ids restart at 0 in every chunk: only offsets matter to the models it serves."""
    from pecli.positions.extension import extended

    length, dev = windows.length, loaded.device
    n = len(stream)
    out: list[torch.Tensor] = []
    nll = torch.empty(max(n - 1, 0))
    with torch.inference_mode():
        for q0 in range(0, n - 1, chunk):
            q1 = min(q0 + chunk, n - 1)  # queries q0..q1-1 predict tokens q0+1..q1
            begin = max(q0 - (length - 2), 0)
            ids = torch.tensor([stream[begin:q1]], device=dev)  # [1, m]
            m = ids.shape[1]
            rows = torch.arange(m, device=dev)
            lo = (rows - (length - 2)).clamp(min=0)
            with extended(loaded, m):  # zero tables (none, alibi) past their rows: exact
                hidden = loaded.model.base_model(
                    input_ids=ids, attention_mask=_band_mask(lo, m),
                    position_ids=rows[None], use_cache=False).last_hidden_state[0]  # [m, d]
            picked = hidden[q0 - begin:]  # [q1 - q0, d]
            targets = torch.tensor(stream[q0 + 1:q1 + 1], device=dev)
            nll[q0:q1] = head_nll(loaded.model, picked, targets).cpu()
            if progress:
                progress(q1 - q0)
    for begin, first, size in zip(windows.offsets, windows.firsts, windows.sizes, strict=True):
        # window target t is stream token begin + t, predicted by query begin + t - 1
        out.append(nll[begin + first - 1:begin + size - 1])
    return out


def buckets(length: int, count: int) -> list[tuple[int, int]]:
    """`count` equal-width position buckets [start, end) over a window's positions 0..L-1
    (fewer when L is small); position 0 is never a target without a start token."""
    edges = np.unique(np.linspace(0, length, min(count, length) + 1).round().astype(int))
    return list(zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True))


# Each row's per-window NLL sums and target counts (the windows with a target in its bucket),
# kept in memory for an interval over more than windows (train lm: seeds and windows together);
# `pecli length` drops them before writing.
PER_WINDOW = ("_window_nll_sums", "_window_tokens")


def summarise(nlls: list[torch.Tensor], windows: Cut, count: int, n_boot: int, seed: int,
              intact: list[torch.Tensor] | None = None) -> list[dict]:
    """Rows by position bucket, then the all-positions row: window_start, window_end (positions
    inside the window, end exclusive), nll_mean, perplexity, tokens, windows (that have a
    target in the bucket), ci_low/ci_high (the perplexity's 95 % bootstrap interval over
    those windows; NaN from fewer than MIN_WINDOWS: a bootstrap of 3 windows cannot say how
    the next would score)); with `intact` (the intact model's NLLs on the same windows) the
    difference of the perplexities with its paired interval over windows (DIFF_COLUMNS)."""
    nll = torch.cat(nlls).double().numpy() if nlls else np.zeros(0)
    pos = np.concatenate(windows.positions()) if len(windows) else np.zeros(0, int)
    owner = np.repeat(np.arange(len(windows)), [len(x) for x in nlls]).astype(int)
    spans = [*buckets(windows.length, count), (0, windows.length)]
    rows = []
    for i, (start, end) in enumerate(spans):
        keep = (pos >= start) & (pos < end)
        sums = np.bincount(owner[keep], weights=nll[keep], minlength=len(windows))
        counts = np.bincount(owner[keep], minlength=len(windows))
        has = counts > 0
        tokens = int(counts.sum())
        mean = float(sums.sum() / tokens) if tokens else float("nan")
        # fewer than MIN_WINDOWS windows: no interval; the table's `windows` says how many
        low, high = ratio_interval(sums[has], counts[has], n_boot=n_boot, seed=seed, transform=np.exp,
                                   least=MIN_WINDOWS)
        rows.append({"window_start": start, "window_end": end,
                     "all_positions": i == len(spans) - 1,
                     "nll_mean": mean, "perplexity": float(np.exp(mean)), "tokens": tokens,
                     "windows": int(has.sum()), "ci_low": low, "ci_high": high,
                     **dict(zip(PER_WINDOW, (sums[has], counts[has]), strict=True)),
                     **_paired(intact, owner, keep, counts, sums, has, windows, n_boot, seed)})
    return rows


def _paired(intact, owner, keep, counts, sums, has, windows: Cut, n_boot: int, seed: int) -> dict:
    """A bucket's DIFF_COLUMNS against the intact model's NLLs on the same windows (NaN
    without them)."""
    if intact is None:
        return diff_columns(reference_row=True)
    nll0 = torch.cat(intact).double().numpy()
    sums0 = np.bincount(owner[keep], weights=nll0[keep], minlength=len(windows))
    return diff_columns(sums[has], sums0[has], counts[has], counts[has], n_boot=n_boot, seed=seed,
                        transform=np.exp, least=MIN_WINDOWS)
