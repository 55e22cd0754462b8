"""Can the token and the position be taken back out of x = E_tok[v] + E_pos[p]?

Pure numpy: no models, no files. The experiment (`pecli.experiments.recover`) builds the
vectors through the model's own embedding stage; everything here works on arrays.

Shapes: T sampled tokens, P positions, V vocabulary rows, d width.

- `nearest`: the nearest candidate row of every query, by cosine similarity.
- `decode_tokens`: token of every x[t, p] by `nearest` over the vocabulary's own rows.
- `token_then_position`: joint decoding: the token first, then the position row nearest to
  x minus that token's row.
- `ridge_classify`: held-out accuracy of a linear probe to a class label (one-vs-rest ridge
  on one-hot targets, `pe_analysis.RidgeLOO`: the probe machinery of `pe probe`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pecli.measures import pe_analysis as pa

_CHUNK = 2048  # queries per matmul block: a [2048, V] score matrix stays under ~0.5 GB


def unit_rows(x: np.ndarray) -> np.ndarray:
    """Rows scaled to norm 1 (zero rows stay zero), float32."""
    x = np.asarray(x, dtype=np.float32)
    norm = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.where(norm == 0, 1, norm)


def nearest(queries: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """Index of the candidate with the largest cosine similarity to each query.

    Args:
        queries: [n, d]; candidates: [V, d].
    Returns:
        [n] int indices (ties: the lowest index, as np.argmax).
    """
    q, c = unit_rows(queries), unit_rows(candidates)
    out = np.empty(len(q), dtype=np.int64)
    for start in range(0, len(q), _CHUNK):
        out[start:start + _CHUNK] = np.argmax(q[start:start + _CHUNK] @ c.T, axis=1)  # [chunk, V]
    return out


def decode_tokens(x: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """Decoded token id of every x[t, p] [T, P, d] over vocabulary rows [V, d] -> [T, P]."""
    t, p, d = x.shape
    return nearest(x.reshape(t * p, d), candidates).reshape(t, p)


def token_then_position(x: np.ndarray, decoded: np.ndarray, candidates: np.ndarray,
                        position_rows: np.ndarray) -> np.ndarray:
    """Joint decoding without knowing either: subtract the decoded token's row, then take the
    nearest position row (cosine). x [T, P, d], decoded [T, P], candidates [V, d],
    position_rows [P, d] -> decoded positions [T, P]."""
    t, p, d = x.shape
    residual = x - candidates[decoded]  # [T, P, d]
    return nearest(residual.reshape(t * p, d), position_rows).reshape(t, p)


@dataclass(frozen=True)
class Extraction:
    """With the token known: what subtracting its row leaves."""

    max_abs_error: float  # max |(x - E_tok[v]) - E_pos[p]| over the sample
    relative_error: float  # mean ||(x - E_tok[v]) - E_pos[p]|| / ||E_pos[p]||
    row_accuracy: float  # how often the nearest position row (cosine) to x - E_tok[v] is p


def extract_known_token(x: np.ndarray, token_rows: np.ndarray, position_rows: np.ndarray
                        ) -> Extraction:
    """x [T, P, d] (sums, before or after a normalisation), token_rows [T, d] (the known token's
    row under the same normalisation), position_rows [P, d] -> Extraction."""
    residual = x - token_rows[:, None, :]  # [T, P, d]
    diff = residual - position_rows[None]  # [T, P, d]
    norm = np.linalg.norm(position_rows, axis=-1)  # [P]
    with np.errstate(invalid="ignore", divide="ignore"):
        rel = np.linalg.norm(diff, axis=-1) / norm[None]  # [T, P]
    t, p, d = x.shape
    found = nearest(residual.reshape(t * p, d), position_rows).reshape(t, p)
    finite = rel[np.isfinite(rel)]  # zero position rows have no relative error
    return Extraction(float(np.abs(diff).max()), float(finite.mean()) if finite.size else np.nan,
                      float((found == np.arange(p)[None]).mean()))


@dataclass(frozen=True)
class ClassProbe:
    correct: np.ndarray  # [n] bool: held-out prediction right
    chance: np.ndarray  # [n] bool: the training folds' most frequent class right
    folds: int


@pa._single_threaded
def ridge_classify(x: np.ndarray, labels: np.ndarray, *, groups: np.ndarray, folds: int = 5,
                   seed: int = 0) -> ClassProbe:
    """Cross-validated linear probe from vectors to a class label.

    One-vs-rest ridge on one-hot targets (`RidgeLOO`, alpha by leave-one-group-out inside the
    training folds), prediction = the largest score; folds over `groups` (the tokens of one
    text stay together) as `pe_analysis.position_regression`.

    Args:
        x: [n, d]; labels: [n] class ids; groups: [n] ids kept in one fold.
    Returns:
        per-row held-out correctness and the majority-class baseline's.
    """
    x, groups = np.asarray(x, dtype=np.float64), np.asarray(groups)
    classes, y = np.unique(labels, return_inverse=True)
    onehot = np.eye(len(classes))[y]  # [n, k]
    fold = pa._fold_of(np.asarray(groups), folds, seed)
    correct = np.zeros(len(x), dtype=bool)
    chance = np.zeros(len(x), dtype=bool)
    for f in range(folds):
        test = fold == f
        model = pa.RidgeLOO().fit(x[~test], onehot[~test], groups[~test])
        correct[test] = model.predict(x[test]).argmax(1) == y[test]
        chance[test] = y[test] == np.bincount(y[~test], minlength=len(classes)).argmax()
    return ClassProbe(correct, chance, folds)


def sinusoid_control(vocab: int, positions: int, dim: int, token_std: float, seed: int
                     ) -> tuple[np.ndarray, np.ndarray]:
    """The control of the original Transformer's scheme: Gaussian token rows [V, d] with the
    model's per-entry token std, and the sinusoid of the same width [P, d] (odd d: the last
    cos dropped), summed without any normalisation."""
    rng = np.random.default_rng(seed)
    tokens = (rng.standard_normal((vocab, dim)) * token_std).astype(np.float32)
    return tokens, pa.sinusoid_like(positions, dim).astype(np.float32)
