"""A linear probe of position-altered features (ablate --probe): held-out accuracy of a
logistic-regression probe on mean-pooled final features, with the model's own positions and
under each intervention, and the `intact` probe transferred to each; intervals are Wilson's
over the held-out texts (each right or wrong: pecli.measures.intervals.accuracy_interval), and
each row's difference from the intact probe on intact features is paired over the same
held-out texts (DIFF_COLUMNS)."""

from __future__ import annotations

import numpy as np

from pecli.runs.names import INTACT

PROBE_TEST_FRACTION = 0.3


def _accuracy(correct: np.ndarray, bootstrap: int, seed: int) -> dict:
    """Accuracy of held-out texts with its interval (Wilson's over them: `accuracy_interval`)."""
    from pecli.measures.intervals import accuracy_interval

    low, high = accuracy_interval(correct, n_boot=bootstrap, seed=seed)
    return {"value": float(correct.mean()), "ci_low": low, "ci_high": high}


def check_probe_labels(labels) -> np.ndarray:
    """The labels as an array, once they are fit for a probe: present, of one type (numbers or
    strings), at least 4 rows of each of at least 2 labels. Checked before any forward pass."""
    from pecli.runs.errors import DataError

    if labels is None:
        raise DataError("--probe needs labels; this data has no label column (use imdb, or a "
                        "file with a 'label' column)")
    missing = [i for i, v in enumerate(labels) if v is None or v != v]
    if missing:
        raise DataError(f"--probe: {len(missing)} row(s) have no label (first: row {missing[0] + 1}); "
                        "drop or fill them")
    kinds = {"number" if isinstance(v, int | float | np.number) and not isinstance(v, bool)
             else "string" if isinstance(v, str) else type(v).__name__ for v in labels}
    if len(kinds) > 1 or kinds - {"number", "string"}:
        raise DataError(f"--probe: labels must all be numbers or all strings, not "
                        f"{' and '.join(sorted(kinds))}; fix the label column")
    y = np.asarray(labels)
    classes, counts = np.unique(y, return_counts=True)
    if len(classes) < 2 or counts.min() < 4:
        raise DataError(f"--probe needs at least 4 rows of each of 2 labels (got "
                        f"{dict(zip(classes.tolist(), counts.tolist(), strict=True))}); raise "
                        "--limit or use a labelled dataset (imdb)")
    return y


def probe_accuracy(features: dict[str, np.ndarray], labels, seed: int = 0,
                   bootstrap: int = 1000) -> list[dict]:
    """Held-out accuracy of logistic regression on each condition's features, one seeded,
    stratified split shared by all; also the `intact` probe applied to each condition."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import train_test_split
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from pecli.measures.intervals import diff_columns

    y = check_probe_labels(labels)
    idx = np.arange(len(y))
    train, test = train_test_split(idx, test_size=PROBE_TEST_FRACTION, random_state=seed,
                                   stratify=y)
    fitted, right = {}, {}
    rows = []
    for cond, x in features.items():
        clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))
        clf.fit(x[train], y[train])
        fitted[cond] = clf
        right[cond] = clf.predict(x[test]) == y[test]
        rows.append({"intervention": cond, "probe_trained_on": cond, "metric": "probe_accuracy",
                     **_accuracy(right[cond], bootstrap, seed)})
    for cond, x in features.items():
        if cond != INTACT:
            right[cond, INTACT] = fitted[INTACT].predict(x[test]) == y[test]
            rows.append({"intervention": cond, "probe_trained_on": INTACT,
                         "metric": "probe_accuracy_transfer",
                         **_accuracy(right[cond, INTACT], bootstrap, seed)})
    for r in rows:  # the same held-out texts under every condition: differences paired over them
        own = right[r["intervention"]] if r["metric"] == "probe_accuracy" else right[r["intervention"], INTACT]
        r.update(diff_columns(own.astype(np.float64), right[INTACT].astype(np.float64), n_boot=bootstrap,
                              seed=seed, reference_row=r["intervention"] == INTACT))
    for r in rows:
        r.update(train_rows=len(train), test_rows=len(test), probe="logistic_regression",
                 probe_features="mean-pooled final hidden state (real tokens)")
    return rows
