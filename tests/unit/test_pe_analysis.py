"""The math of pecli.measures.pe_analysis against closed forms and constructed embeddings."""

from __future__ import annotations

import numpy as np
import pytest

from pecli.measures import pe_analysis as pa
from pecli.runs.errors import ConfigError

SIZES = [(16, 32, 10000.0), (64, 16, 100.0), (200, 6, 10.0), (512, 512, 10000.0)]


def test_sinusoid_matches_the_formula():
    pe = pa.sinusoidal(50, 8, base=10000.0)
    for pos in (0, 1, 7, 49):
        for i in range(4):
            w = 10000.0 ** (-2 * i / 8)
            assert pe[pos, 2 * i] == pytest.approx(np.sin(pos * w), abs=1e-15)
            assert pe[pos, 2 * i + 1] == pytest.approx(np.cos(pos * w), abs=1e-15)


@pytest.mark.parametrize("positions,dim,base", SIZES)
def test_rotation_property_to_float_noise(positions, dim, base):
    offsets = [-(positions - 1), -3, -1, 0, 1, 2, positions // 2, positions - 1, 5 * positions]
    errors = pa.rotation_errors(positions, dim, base, offsets)
    assert errors.max() < 1e-9
    # The check can fail: the rotation of the wrong offset is far off.
    pe = pa.sinusoidal(positions, dim, base)
    wrong = pe @ pa.rotation(2, dim, base).T
    assert np.abs(pa.sinusoidal_at(np.arange(positions) + 1, dim, base) - wrong).max() > 0.1


def test_rotation_errors_are_the_whole_matrix_products():
    """rotation_errors applies M_k block by block; written literally, with the whole M_k."""
    positions, dim, base = 40, 12, 100.0
    offsets = [-39, -5, 0, 3, 77]
    pe, pos = pa.sinusoidal(positions, dim, base), np.arange(positions)
    literal = [np.abs(pa.sinusoidal_at(pos + k, dim, base) - pe @ pa.rotation(k, dim, base).T).max()
               for k in offsets]
    assert np.allclose(pa.rotation_errors(positions, dim, base, offsets), literal, rtol=0, atol=1e-14)
    check = pa.dot_products(positions, dim, base)  # per offset, against a mask of the pairs
    diffs = np.subtract.outer(pos, pos)
    for k in (-39, -1, 0, 7, 39):
        assert check.by_offset[k] == pytest.approx(check.gram[diffs == k].mean(), abs=1e-12)


@pytest.mark.parametrize("dim", [2, 8, 64])
def test_rotations_are_orthogonal_and_compose(dim):
    a, b = pa.rotation(3, dim), pa.rotation(-11, dim)
    assert np.abs(a @ a.T - np.eye(dim)).max() < 1e-12
    assert np.abs(a @ b - pa.rotation(-8, dim)).max() < 1e-12
    assert np.abs(pa.rotation(0, dim) - np.eye(dim)).max() == 0


@pytest.mark.parametrize("positions,dim,base", SIZES[:3])
def test_dot_product_symmetric_and_a_function_of_the_offset(positions, dim, base):
    check = pa.dot_products(positions, dim, base)
    assert np.abs(check.gram - check.gram.T).max() < 1e-12
    assert check.offset_spread < 1e-9  # every pair with the same p - q: the same value
    assert check.symmetry_error < 1e-9  # f(k) = f(-k): depends on |p - q|
    assert check.closed_form_error < 1e-9
    assert check.by_offset[0] == pytest.approx(dim / 2)
    assert max(v for k, v in check.by_offset.items() if k) < dim / 2  # the peak is at 0


def test_dot_product_decays_but_not_monotonically():
    f = pa.dot_products(512, 64).by_offset
    values = np.array([f[k] for k in range(512)])
    assert values[0] > values[50] > values[400]
    assert (np.diff(values) > 0).any()  # it rises again in places


@pytest.mark.parametrize("positions,dim,base,flag", [(16, 7, 10000.0, "--dim"), (16, 0, 10000.0, "--dim"),
                                                     (0, 8, 10000.0, "--positions"), (4, 8, 1.0, "--base")])
def test_bad_sizes_name_the_flag(positions, dim, base, flag):
    with pytest.raises(ConfigError, match=flag):
        pa.sinusoidal(positions, dim, base)


def _ramp(n: int, d: int, seed: int = 0) -> np.ndarray:
    """Row p = p * a + b: position is a linear function of every row."""
    rng = np.random.default_rng(seed)
    return np.arange(n)[:, None] * rng.normal(size=d) + rng.normal(size=d)


@pytest.mark.parametrize("n,d", [(100, 8), (256, 64), (64, 200)])  # the last: d > n (min-norm)
def test_regression_recovers_position_from_a_ramp_exactly(n, d):
    result = pa.position_regression(_ramp(n, d))
    assert result.mae == 0.0
    assert result.chance_mae > n / 5


def test_regression_from_shuffled_random_rows_is_no_better_than_chance():
    rng = np.random.default_rng(1)
    rows = rng.normal(size=(300, 32))
    for seed in (0, 1, 2):
        result = pa.position_regression(rows[rng.permutation(300)], folds=5, seed=seed)
        assert result.mae >= 0.9 * result.chance_mae
    # chance: |round(mean) - y| over a near-uniform 0..299 is about n / 4
    assert result.chance_mae == pytest.approx(75, rel=0.05)


def test_regression_of_the_sinusoid_reference_is_far_below_chance():
    result = pa.position_regression(pa.sinusoidal(256, 64))
    assert result.mae < 0.05 * result.chance_mae


def test_groups_stay_in_one_fold_and_folds_are_balanced():
    groups = np.repeat(np.arange(10), 7)
    fold = pa._fold_of(groups, 5, seed=3)
    for g in range(10):
        assert len(set(fold[groups == g])) == 1
    assert np.bincount(fold).tolist() == [14] * 5
    with pytest.raises(ConfigError, match="--limit"):
        pa._fold_of(np.arange(3), 5, seed=0)


def test_least_squares_matches_sklearn():
    from sklearn.linear_model import LinearRegression

    rng = np.random.default_rng(0)
    for n, d in [(50, 10), (20, 40)]:
        x, y, t = rng.normal(size=(n, d)), rng.normal(size=n), rng.normal(size=(7, d))
        ours = pa.LeastSquares().fit(x, y).predict(t)
        assert np.abs(ours - LinearRegression().fit(x, y).predict(t)).max() < 1e-10


def test_ridge_matches_sklearn_and_its_loo_is_exact():
    from sklearn.linear_model import Ridge
    from sklearn.preprocessing import StandardScaler

    rng = np.random.default_rng(0)
    for n, d in [(40, 10), (15, 30)]:
        x = StandardScaler().fit_transform(rng.normal(size=(n, d)))  # already standardised
        y, t = rng.normal(size=n), rng.normal(size=(5, d))
        ridge = pa.RidgeLOO(alphas=[0.3, 3.0, 30.0]).fit(x, y)
        ref = Ridge(ridge.alpha).fit(x, y)
        assert np.abs(ridge.predict(t) - ref.predict(t)).max() < 1e-9
        for alpha, loo in ridge.loo.items():
            brute = np.mean([(Ridge(alpha).fit(np.delete(x, i, 0), np.delete(y, i))
                              .predict(x[i:i + 1])[0] - y[i]) ** 2 for i in range(n)])
            assert loo == pytest.approx(brute, rel=1e-8)
        assert ridge.alpha == min(ridge.loo, key=ridge.loo.get)


def test_order_classification_ordered_vs_random():
    assert pa.order_accuracy(_ramp(200, 16), pairs=600, seed=0) > 0.97
    rows = np.random.default_rng(2).normal(size=(200, 16))
    assert abs(pa.order_accuracy(rows, pairs=600, seed=0) - 0.5) < 0.08


def test_cosine_matrix_and_grid():
    x = _ramp(10, 4)
    sim = pa.cosine_matrix(x)
    assert np.allclose(np.diag(sim), 1.0) and np.allclose(sim, sim.T)
    assert pa.grid(512, 64)[[0, -1]].tolist() == [0, 511] and len(pa.grid(512, 64)) == 64
    assert pa.grid(10, 64).tolist() == list(range(10))


def test_ridge_leave_one_group_out_is_exact():
    from sklearn.linear_model import Ridge
    from sklearn.preprocessing import StandardScaler

    rng = np.random.default_rng(4)
    for n, d in [(36, 8), (24, 40)]:
        x = StandardScaler().fit_transform(rng.normal(size=(n, d)))
        y = rng.normal(size=n)
        groups = np.repeat(np.arange(6), n // 6)
        ridge = pa.RidgeLOO(alphas=[0.1, 10.0]).fit(x, y, groups)
        for alpha, loo in ridge.loo.items():
            sq = 0.0
            for g in range(6):
                out = groups == g
                pred = Ridge(alpha).fit(x[~out], y[~out]).predict(x[out])
                sq += np.sum((pred - y[out]) ** 2)
            assert loo == pytest.approx(sq / n, rel=1e-8)
