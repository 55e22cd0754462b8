"""The math of position encodings: sinusoids, their rotations, and probes of embedding matrices.

Pure numpy / scikit-learn: no models, no files. Shapes are [positions, dim] unless stated.

- `sinusoidal`, `rotation`, `rotation_errors`, `dot_products`: Vaswani et al. (2017) and the
  relative-position property PE(p + k) = M_k PE(p).
- `position_regression`, `order_accuracy`, `cosine_matrix`: the analyses of Wang & Chen
  (EMNLP 2020, "What Do Position Embeddings Learn?") of a position-embedding matrix, also
  used on hidden states (`groups` keeps the tokens of one text in one fold).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np
from threadpoolctl import threadpool_limits

from pecli.positions.sinusoid import (  # noqa: F401  (pe_analysis.sinusoidal etc., as before)
    check_sinusoid_args,
    frequencies,
    sinusoid_like,
    sinusoidal,
    sinusoidal_at,
)
from pecli.runs.errors import ConfigError


def rotation(k: float, dim: int, base: float = 10000.0) -> np.ndarray:
    """M_k [dim, dim]: block-diagonal 2x2 rotations by k w_i, with PE(p + k) = M_k PE(p) for every p.

    On a pair (sin a, cos a): sin(a + b) = sin a cos b + cos a sin b and
    cos(a + b) = cos a cos b - sin a sin b, so the block is [[cos b, sin b], [-sin b, cos b]].
    It depends on k and the frequencies only, never on p.
    """
    blocks = rotation_blocks(k, dim, base)
    m = np.zeros((dim, dim))
    for i, block in enumerate(blocks):
        m[2 * i:2 * i + 2, 2 * i:2 * i + 2] = block
    return m


def rotation_blocks(k: float, dim: int, base: float = 10000.0) -> np.ndarray:
    """The 2x2 diagonal blocks of M_k, one per (sin, cos) pair -> [dim/2, 2, 2]."""
    b = k * frequencies(dim, base)  # [dim/2]
    return np.stack([np.stack([np.cos(b), np.sin(b)], -1), np.stack([-np.sin(b), np.cos(b)], -1)], -2)


def rotation_errors(positions: int, dim: int, base: float, offsets) -> np.ndarray:
    """max over p in 0..positions-1 of |PE(p + k) - M_k PE(p)|, for each offset k -> [len(offsets)].

    PE(p + k) is evaluated from the formula (p + k may leave 0..positions-1). M_k acts block
    by block (the product with the whole matrix, its zeros included, is the same and costs dim
    times more).
    """
    check_sinusoid_args(positions, dim, base)
    pos = np.arange(positions)
    pairs = sinusoidal_at(pos, dim, base).reshape(positions, dim // 2, 2)  # [P, dim/2, (sin, cos)]
    errors = []
    for k in offsets:
        blocks = rotation_blocks(k, dim, base)  # moved_j = sum over c of block[j, c] x_c
        moved = pairs[:, :, None, 0] * blocks[:, :, 0] + pairs[:, :, None, 1] * blocks[:, :, 1]
        errors.append(np.abs(sinusoidal_at(pos + k, dim, base) - moved.reshape(positions, dim)).max())
    return np.array(errors)


@dataclass(frozen=True)
class DotCheck:
    """PE(p).PE(q) over all pairs and how far it is from a function of p - q alone."""

    gram: np.ndarray  # [P, P]
    by_offset: dict[int, float]  # offset p - q -> mean dot product over its pairs
    offset_spread: float  # max over offsets of (max - min) among pairs with that offset
    symmetry_error: float  # max |f(k) - f(-k)|: depends on |p - q| only
    closed_form_error: float  # max |PE(p).PE(q) - sum_i cos((p - q) w_i)|


def dot_products(positions: int, dim: int, base: float = 10000.0) -> DotCheck:
    """The Gram matrix of the encoding and its checks (the sum of cos(k w_i) over pairs)."""
    pe = sinusoidal(positions, dim, base)
    gram = pe @ pe.T  # [P, P]
    ks = np.arange(-(positions - 1), positions)
    closed = np.cos(ks[:, None] * frequencies(dim, base)).sum(-1)  # f(k), one per offset
    by_offset, spread, closed_error = {}, 0.0, 0.0
    for k, f in zip(ks.tolist(), closed, strict=True):
        values = np.diagonal(gram, offset=-k)  # the pairs with p - q = k
        by_offset[k] = float(values.mean())
        spread = max(spread, float(values.max() - values.min()))
        closed_error = max(closed_error, float(np.abs(values - f).max()))
    symmetry = max(abs(by_offset[k] - by_offset[-k]) for k in by_offset)
    return DotCheck(gram, by_offset, spread, symmetry, closed_error)


# --- Wang & Chen: what a matrix of position vectors encodes --------------------------


def _single_threaded(fn):
    """Run with one BLAS thread: these matrices are small (d <= ~1000), and on a busy machine
    OpenBLAS's spinning threads made one 410 x 410 eigh take 3 s instead of 0.03 s."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with threadpool_limits(1):
            return fn(*args, **kwargs)

    return wrapper


def _fold_of(groups: np.ndarray, folds: int, seed: int) -> np.ndarray:
    """Fold index per row: groups shuffled with `seed`, dealt round robin into `folds`."""
    unique = np.unique(groups)
    if len(unique) < folds:
        raise ConfigError(f"{folds}-fold cross-validation needs at least {folds} rows/texts "
                          f"(got {len(unique)}); raise --limit or lower --folds")
    order = np.random.default_rng(seed).permutation(len(unique))
    fold_of_group = np.empty(len(unique), dtype=int)
    fold_of_group[order] = np.arange(len(unique)) % folds
    return fold_of_group[np.searchsorted(unique, groups)]


class LeastSquares:
    """Ordinary least squares with an intercept (minimum-norm when d >= n), as sklearn's
    LinearRegression computes it, through numpy's lstsq (scipy's is ~30x slower here)."""

    def fit(self, x: np.ndarray, y: np.ndarray) -> LeastSquares:
        self.x_mean, self.y_mean = x.mean(0), y.mean()
        self.coef = np.linalg.lstsq(x - self.x_mean, y - self.y_mean, rcond=None)[0]  # [d]
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        return (x - self.x_mean) @ self.coef + self.y_mean


class RidgeLOO:
    """Ridge regression on standardised features; alpha chosen by leave-one-out error.

    For hidden states (many correlated dims, a few thousand tokens). With the eigenbasis
    (lam, V) of X'X and Z = XV, the fit for any alpha is V (Z'y / (lam + alpha)) and its hat
    matrix is H = 11'/n + Z diag(1 / (lam + alpha)) Z'. Leaving out row i gives the residual
    r_i / (1 - H_ii); leaving out a group g (the tokens of one text, whose neighbours share
    context and would make plain leave-one-out pick too little shrinkage) gives
    (I - H_gg)^-1 r_g. Every alpha costs one pass over Z.
    """

    def __init__(self, alphas=tuple(np.logspace(-2, 4, 7))):
        self.alphas = alphas

    def fit(self, x: np.ndarray, y: np.ndarray, groups: np.ndarray | None = None) -> RidgeLOO:
        """Fit; y is [n] or [n, k] (k targets share alpha, e.g. one-hot classes); `groups` [n]
        switches alpha selection to leave-one-group-out."""
        self.mean, self.scale = x.mean(0), x.std(0)
        self.scale[self.scale == 0] = 1.0
        self.y_mean = y.mean(0)
        xs, yc = (x - self.mean) / self.scale, y - self.y_mean  # [n, d], [n]
        if len(x) >= x.shape[1]:
            lam, v = np.linalg.eigh(xs.T @ xs)  # [d], [d, d]
            z = xs @ v  # [n, d]
        else:  # fewer rows than dims: the same eigenpairs from the [n, n] kernel, cheaper
            lam, u = np.linalg.eigh(xs @ xs.T)  # [n], [n, n]
            keep = lam > 1e-10 * max(lam.max(), 1e-300)
            lam, u = lam[keep], u[:, keep]
            z = u * np.sqrt(lam)  # [n, r] = xs v
            v = xs.T @ u / np.sqrt(lam)  # [d, r]
        zy = z.T @ yc  # [r] or [r, k]
        col = (slice(None),) + (None,) * (yc.ndim - 1)  # broadcasts [r] / [n] over the k targets
        members = None if groups is None else [np.flatnonzero(groups == g) for g in np.unique(groups)]
        best, self.loo = None, {}
        for alpha in self.alphas:
            inv = 1.0 / (np.clip(lam, 0, None) + alpha)  # [r]
            resid = yc - z @ (zy * inv[col])  # [n] or [n, k]
            if members is None:
                hat = 1.0 / len(x) + (z**2) @ inv  # [n], the diagonal of H
                loo = np.mean((resid / (1.0 - hat)[col]) ** 2)
            else:
                sq = 0.0
                for idx in members:
                    zg = z[idx]  # [n_g, r]
                    h = 1.0 / len(x) + (zg * inv) @ zg.T  # [n_g, n_g], the block H_gg
                    try:
                        sq += np.sum(np.linalg.solve(np.eye(len(idx)) - h, resid[idx]) ** 2)
                    except np.linalg.LinAlgError:  # a group the rest cannot predict at all (few
                        sq = math.inf  # groups, little shrinkage): this alpha's error is unbounded
                        break
                loo = sq / len(x)
            self.loo[alpha] = float(loo)
            if best is None or loo < best[0]:
                best = (loo, alpha, v @ (zy * inv[col]))
        _, self.alpha, self.coef = best
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        return ((x - self.mean) / self.scale) @ self.coef + self.y_mean


def _regressor(kind: str):
    if kind == "linear":  # the paper's: ordinary least squares
        return LeastSquares()
    if kind == "ridge":
        return RidgeLOO()
    raise ConfigError(f"unknown regressor {kind!r}; use linear or ridge")


@dataclass(frozen=True)
class RegressionResult:
    mae: float  # mean |round(prediction) - position| over held-out rows
    chance_mae: float  # the same for predicting the training folds' mean position
    folds: int
    rows: int
    errors: np.ndarray | None = field(default=None, compare=False, repr=False)  # [rows] held-out
    chance_errors: np.ndarray | None = field(default=None, compare=False, repr=False)


@_single_threaded
def position_regression(x: np.ndarray, y: np.ndarray | None = None, *, folds: int = 5,
                        seed: int = 0, groups: np.ndarray | None = None,
                        regressor: str = "linear") -> RegressionResult:
    """Cross-validated linear regression from vectors back to their positions.

    Args:
        x: vectors [n, d] (rows of an embedding matrix, or hidden states of tokens).
        y: their positions [n]; default the row index (a position-embedding matrix).
        folds: k of k-fold cross-validation; the rows (or groups) are shuffled with `seed`.
        groups: [n] ids keeping rows together in one fold (the tokens of one text).
        regressor: "linear" (ordinary least squares, as Wang & Chen) or "ridge" (alpha by
            leave-one-group-out within the training folds when `groups` is given).
    Returns:
        held-out mean absolute error of the rounded prediction, and the MAE of the
        constant prediction (training mean, rounded) over the same folds as chance.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.arange(len(x)) if y is None else np.asarray(y)
    grouped = groups is not None
    groups = np.asarray(groups) if grouped else np.arange(len(x))
    fold = _fold_of(groups, folds, seed)
    errors = np.empty(len(x))
    chance = np.empty(len(x))
    for f in range(folds):
        test = fold == f
        model = _regressor(regressor)
        if isinstance(model, RidgeLOO):
            model.fit(x[~test], y[~test], groups[~test] if grouped else None)
        else:
            model.fit(x[~test], y[~test])
        errors[test] = np.abs(np.round(model.predict(x[test])) - y[test])
        chance[test] = np.abs(np.round(y[~test].mean()) - y[test])
    return RegressionResult(float(errors.mean()), float(chance.mean()), folds, len(x), errors, chance)


def _pairs(positions: np.ndarray, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """n random ordered pairs (i, j), i != j, drawn from `positions`."""
    i = rng.choice(positions, size=n)
    j = rng.choice(positions, size=n)
    same = i == j
    while same.any():
        j[same] = rng.choice(positions, size=int(same.sum()))
        same = i == j
    return i, j


def order_accuracy(x: np.ndarray, *, folds: int = 5, pairs: int = 2000, seed: int = 0) -> float:
    """Held-out accuracy of classifying which of two rows has the smaller position (the mean
    of `order_correct`)."""
    return float(order_correct(x, folds=folds, pairs=pairs, seed=seed).mean())


@_single_threaded
def order_correct(x: np.ndarray, *, folds: int = 5, pairs: int = 2000, seed: int = 0) -> np.ndarray:
    """Whether each held-out pair's order is classified right: which of two rows has the smaller position.

    Features are the concatenation [x_i, x_j], label i < j, logistic regression, as Wang &
    Chen. Stricter than their pair-level split: the positions are split into `folds` folds
    and a fold's test pairs use only its held-out positions, training pairs only the
    others, so a classifier cannot pass by memorising a score per row.

    Args:
        x: position vectors [n, d], row p for position p.
        pairs: training pairs per fold (test pairs: a quarter of that).
    Returns:
        [test pairs of all folds] bool, True where the classifier was right.
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x = np.asarray(x, dtype=np.float64)
    n = len(x)
    if n < 2 * folds:
        raise ConfigError(f"order classification needs at least {2 * folds} positions (got {n})")
    fold = _fold_of(np.arange(n), folds, seed)
    rng = np.random.default_rng(seed)
    correct = []
    for f in range(folds):
        train_i, train_j = _pairs(np.flatnonzero(fold != f), pairs, rng)
        test_i, test_j = _pairs(np.flatnonzero(fold == f), max(pairs // 4, 1), rng)
        clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))
        clf.fit(np.hstack([x[train_i], x[train_j]]), train_i < train_j)
        predicted = clf.predict(np.hstack([x[test_i], x[test_j]]))
        correct.append(predicted == (test_i < test_j))
    return np.concatenate(correct)


def cosine_matrix(x: np.ndarray) -> np.ndarray:
    """Cosine similarity of every pair of rows [n, n] (zero rows give 0)."""
    from sklearn.metrics.pairwise import cosine_similarity

    return cosine_similarity(np.asarray(x, dtype=np.float64))


def grid(n: int, points: int) -> np.ndarray:
    """At most `points` evenly spaced indices in 0..n-1 (both ends included)."""
    return np.unique(np.linspace(0, n - 1, min(n, points)).round().astype(int))


# --- a model's position rows and hidden states (pe probe, pe recover) -----------------------


def embedding_rows(loaded) -> np.ndarray:
    """The model's position-embedding rows for positions 0..N-1 [N, d] (after pos_offset)."""
    from pecli.models.architectures import position_embedding

    table = position_embedding(loaded.model, loaded.spec)
    return table.weight.detach()[loaded.spec.pos_offset:].float().cpu().numpy()


def collect_hidden(loaded, ids: list[list[int]], batch_size: int | None = None):
    """Hidden states of every real token at every layer.

    Returns:
        (states [layers+1][tokens, d] float32 numpy, layer 0 = embedding output;
         positions [tokens]; text index [tokens]).
    """
    import torch

    from pecli.runs.batching import default_token_budget, length_batches, pad
    from pecli.runs.loop import run_batches

    base = getattr(loaded.model, "base_model", loaded.model)  # no LM head: no [t, vocab] logits
    pad_id = loaded.tokenizer.pad_token_id
    lengths = [len(x) for x in ids]

    def one(batch: list[int], width: int):  # (states per layer [n_real, d], positions, text index)
        # Right padding: a real token's index in its sequence is its position.
        input_ids, mask = pad([ids[i] for i in batch], pad_id, loaded.device, "right", width)  # [b, t]
        out = base(input_ids=input_ids, attention_mask=mask, output_hidden_states=True)
        real = mask.bool()  # [b, t]
        pos = torch.arange(input_ids.shape[1], device=mask.device).expand_as(mask)  # [b, t]
        text = torch.tensor(batch, device=mask.device)[:, None].expand_as(mask)  # [b, t]
        return ([h[real].float().cpu().numpy() for h in out.hidden_states],  # h: [b, t, d]
                pos[real].cpu().numpy(), text[real].cpu().numpy())

    with torch.inference_mode():
        _, done = run_batches(length_batches(lengths, default_token_budget(loaded.device), batch_size),
                              lengths, one, join=_joined_states)
    return _joined_states(list(done.values()))  # every batch, in batch order


def _joined_states(parts: list) -> tuple:
    """(states per layer, positions, texts) of `parts` joined: the batches of a run, or the
    halves of a batch halved on out-of-memory."""
    if len(parts) == 1:
        return parts[0]
    return ([np.concatenate(layer) for layer in zip(*(p[0] for p in parts), strict=True)],
            np.concatenate([p[1] for p in parts]), np.concatenate([p[2] for p in parts]))


def hidden_states(loaded, ids: list[list[int]], intervention, seed: int, batch_size: int | None):
    """`collect_hidden` under an intervention (restored afterwards)."""
    from pecli.positions.conditions import plan

    with plan(intervention=intervention).applied(loaded, seed):
        return collect_hidden(loaded, ids, batch_size)


def model_texts(loaded, data, texts: list[str], max_length: int):
    """The texts tokenised for `loaded` (at most `max_length` tokens and its positions) and
    the columns every row on them shares: (encoding, columns)."""
    from pecli.runs.batching import encode

    length = min(max_length, loaded.max_positions)
    enc = encode(loaded.tokenizer, texts, length)
    return enc, {**loaded.provenance(), **data.provenance(), "tokens": enc.tokens,
                 "max_length": length, "truncated_texts": enc.truncated}
