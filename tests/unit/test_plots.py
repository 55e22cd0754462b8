"""Figures: one colour per condition across figures, points not bars, log only across decades,
the headline aggregation on its own panels, titles that say what and on what."""

from __future__ import annotations

import itertools

import matplotlib.colors as mcolors
import numpy as np
import pandas as pd
import pytest

from pecli.plots import ablate, perplexity, ruler, style, training, tune


@pytest.fixture
def captured(monkeypatch):
    """Figures handed to `save` by the plot modules, kept open for inspection."""
    figs = []

    def keep(fig, path, dpi=150):
        figs.append(fig)
        return path

    for module in (ablate, perplexity, ruler, training, tune):
        monkeypatch.setattr(module, "save", keep)
    return figs


def _colors(ax) -> set[str]:
    out = {mcolors.to_hex(line.get_color()) for line in ax.get_lines()}
    out |= {mcolors.to_hex(c.get_edgecolor()) for c in ax.collections if hasattr(c, "get_edgecolor")
            and len(c.get_edgecolor())}
    return out


def test_color_of_is_fixed_for_study_names_and_stable_for_others():
    assert style.color_of("zero") == "#D55E00" and style.color_of("learned") == "#000000"
    assert style.color_of("lm-alibi") == style.color_of("alibi") == style.color_of("toy-alibi")
    assert style.color_of("swap:gpt2") == style.color_of("swap:gpt2")


def test_the_remedies_of_one_figure_have_distinct_colours():
    """The conditions the offline preset draws together: each its own colour, any parameters."""
    together = [["intact", "yarn:2", "sinks:0:2048", "sinks:4:2044", "lminfinite:4:8192",
                 "selfextend:4:2048", "rerope:2048"],
                ["intact", "droplow:0.25", "drophigh:0.25", "zero@even", "zero"]]
    for names in together:
        assert len({style.color_of(n) for n in names}) == len(names), names
    assert style.color_of("rerope:512") == style.color_of("rerope:2048")
    assert style.color_of("sinks:0:64") != style.color_of("sinks:4:60")  # window attention apart
    assert style.color_of("sinks:4:60@even") != style.color_of("sinks:4:60")  # per-layer apart


def test_a_length_figure_gets_a_detail_panel_only_where_one_line_squeezes_the_rest():
    from pecli.plots.length import detail_limits

    def table(tops: dict[str, list[float]]) -> pd.DataFrame:
        return pd.DataFrame([{"intervention": c, "nll_mean": v, "tokens": 1, "all_positions": False}
                             for c, values in tops.items() for v in values])

    rising = table({"intact": [3.7, 4.3, 7.4], "yarn:2": [3.8, 3.6, 3.6], "rerope:64": [3.7, 3.6, 3.6]})
    low, high = detail_limits(rising)
    assert low < 3.6 and 3.8 < high < 4.3  # the flat lines fill the panel; the rise leaves it
    assert detail_limits(table({"intact": [3.7, 3.9], "zero": [6.0, 6.3], "drophigh:0.25": [5.7, 5.9]})) is None


def test_a_length_figure_draws_each_conditions_paired_difference_under_its_lines(monkeypatch):
    """Under the lines, each condition's diff_vs_intact by bucket with its paired interval as
    bars (symmetric log where they span decades, said on the axis); none without the columns."""
    from pathlib import Path

    from pecli.plots import length

    figs = []
    monkeypatch.setattr(length, "save", lambda fig, path, dpi=150: figs.append(fig) or path)
    df = pd.read_csv(Path(__file__).parents[2] / "results/offline/bands-length-smollm2/length.csv")
    length.nll_by_position(df, Path("length.png"))
    below = [ax for ax in figs[-1].axes if ax.get_title().startswith("Paired difference from intact")]
    assert len(below) == 1 and below[0].get_yscale() == "symlog" and "symmetric log" in below[0].get_ylabel()
    drawn = {c.get_label(): c for c in below[0].containers}
    assert set(drawn) == {"droplow:0.25", "drophigh:0.25", "zero@even", "zero"}
    low = df[(df["intervention"] == "droplow:0.25") & ~df["all_positions"]]
    np.testing.assert_allclose(drawn["droplow:0.25"].lines[0].get_ydata(), low["diff_vs_intact"])
    bar = drawn["droplow:0.25"].lines[2][0].get_segments()[-1]  # the last bucket's bar
    np.testing.assert_allclose([bar[0][1], bar[1][1]], low[["diff_ci_low", "diff_ci_high"]].iloc[-1])
    length.nll_by_position(df.drop(columns=["diff_vs_intact", "diff_ci_low", "diff_ci_high"]), Path("length.png"))
    assert not [ax for ax in figs[-1].axes if ax.get_title().startswith("Paired difference")]


def test_wants_log_only_across_decades():
    assert not style.wants_log([905, 1385, 227])
    assert style.wants_log([120, 19600])
    assert not style.wants_log([0.5])


def _ablate_tables():
    common = dict(model="minilm", dataset="imdb", split="test", rows=4, special_tokens="included")
    main = []
    for iv, layer in itertools.product(["shuffle", "zero"], range(3)):
        for metric, value in (("cosine_mean", 0.9 - 0.1 * layer), ("cosine_std", 0.05)):
            main.append({**common, "intervention": iv, "layer": layer, "final_layer": layer == 2,
                         "metric": metric, "value": value})
        if layer == 2:
            main.append({**common, "intervention": iv, "layer": 2, "final_layer": True,
                         "metric": "z_score", "value": 10.0})
    rand = pd.DataFrame([{**common, "intervention": "none", "metric": "random_cosine_hist_count",
                          "value": 5, "bin_left": b / 10, "bin_right": b / 10 + 0.1,
                          "pairs": 100, "dim": 8} for b in range(-3, 3)])
    return pd.DataFrame(main), rand


def test_a_condition_has_one_colour_in_every_ablate_figure(captured, tmp_path):
    main, rand = _ablate_tables()
    ablate.cosine_by_layer(main, tmp_path / "a.png")
    ablate.random_baseline(main, rand, tmp_path / "b.png")
    layers, baseline = (fig.axes[0] for fig in captured)
    for ax in (layers, baseline):
        assert style.color_of("zero").lower() in _colors(ax)
        assert style.color_of("shuffle").lower() in _colors(ax)
    title = layers.get_title()
    assert "minilm" in title and "imdb/test" in title and "4 texts" in title and "cosine" in title
    assert layers.get_xlabel() and layers.get_ylabel()
    labels = layers.get_legend_handles_labels()[1]
    assert any("s.d." in label for label in labels)  # the band is named in the legend


def test_random_baseline_keeps_every_observed_line_inside_the_frame_and_visible(captured, tmp_path):
    main, rand = _ablate_tables()
    final = main["final_layer"] & (main["metric"] == "cosine_mean")
    main.loc[final, "value"] = 1.0  # both conditions at 1.0000: one line on the other
    ablate.random_baseline(main, rand, tmp_path / "b.png")
    ax = captured[0].axes[0]
    marks = [line for line in ax.get_lines() if line.get_label().endswith(")")]
    assert len(marks) == 2 and ax.get_xlim()[1] > 1.0  # not drawn on the frame
    assert {line.get_linestyle() for line in marks} == {"-", "--"}  # the second dashed


def _positions_table(gap: float) -> pd.DataFrame:
    return pd.DataFrame([{"model": "t5", "dataset": "imdb", "split": "test", "rows": 8,
                          "intervention": iv, "layer": 6, "position": p, "tokens": 8 - p // 10,
                          "value": 1.0 - gap * (1 + (iv == "shuffle")) * (1 + p % 3)}
                         for iv in ("zero", "shuffle") for p in range(60)])


@pytest.mark.parametrize("gap,log", [(2e-5, True), (0.05, False)])
def test_per_position_cosines_near_one_are_drawn_as_distance_from_one(captured, tmp_path, gap, log):
    ablate.cosine_by_position(_positions_table(gap), tmp_path / "p.png")
    ax = captured[0].axes[0]
    assert (ax.get_yscale() == "log") is log
    assert ax.get_ylabel().startswith("1 − mean cosine") is log
    ys = [y for line in ax.get_lines() for y in line.get_ydata() if y == y]
    assert bool(max(ys) < 1e-3) == log  # 1 − cosine itself, not the cosine with an offset


def _perplexity_table(huge: float):
    rows = []
    for iv, (mask, sem, proto), agg in itertools.product(
            ["intact", "zero"],
            [("default", "legacy", "study"), ("default", "legacy", "relative"),
             ("linear", "legacy", "study"), ("linear", "legacy", "relative"),
             ("linear", "log-bias", "study"), ("linear", "log-bias", "relative")],
            perplexity.AGG_ORDER):
        value = huge if (agg == "mean_per_token" and sem == "legacy" and mask == "linear") else 100.0
        rows.append(dict(model="smollm2", dataset="truthfulqa", split="validation", rows=10,
                         tokens=120, intervention=iv, mask=mask, mask_semantics=sem, protocol=proto,
                         aggregation=agg, value=value + (iv == "zero"), ci_low=value - 5,
                         ci_high=value + 5))
    return pd.DataFrame(rows)


def test_perplexity_figure_headline_panels_points_and_log_only_where_needed(captured, tmp_path):
    perplexity.aggregation_figure(_perplexity_table(1e12), tmp_path / "p.png")
    fig = captured[0]
    titles = [ax.get_title() for ax in fig.axes]
    assert sum("corpus perplexity (headline)" in t for t in titles) == 2  # one per protocol
    scales = {ax.get_title().split("\n")[0]: ax.get_yscale() for ax in fig.axes}
    assert scales[perplexity.AGG_LABEL["mean_per_token"]] == "log"  # 100 .. 1e12
    assert scales["corpus perplexity (headline), study protocol"] == "linear"  # all near 100
    for ax in fig.axes:  # a linear axis cut above 0 says so (issue 44 §4); a log one need not
        low = ax.get_ylim()[0]
        said = "not 0)" in ax.get_title()
        assert said == (ax.get_yscale() == "linear" and low > 0), ax.get_title()
    for ax in fig.axes:
        assert not ax.patches  # no bars anywhere
        assert ax.get_xticklabels()[0].get_text() == "no mask"
    head = fig.axes[0]
    # learned and zero at 3 variants: 3 points each, with interval bars (error bar lines)
    assert any(c.__class__.__name__ == "LineCollection" for c in head.collections)
    assert "smollm2" in fig._suptitle.get_text() and "10 texts" in fig._suptitle.get_text()


def test_one_point_learning_curve_gets_an_axis_from_zero(captured, tmp_path):
    curve = pd.DataFrame([dict(pe="learned", metric=m, step=20, value=v, dataset="imdb",
                               layers=1, width=8, context=16, tokenizer="bpe", vocab_size=300,
                               rows=4) for m, v in (("eval_loss", 5.0), ("train_loss", 5.5))])
    csv = tmp_path / "curve.csv"
    curve.to_csv(csv, index=False)
    training.lm_curve(csv, tmp_path / "c.png")
    low, high = captured[0].axes[0].get_xlim()
    assert low == 0 and 20 < high < 30


def test_learning_curve_title_counts_the_held_out_texts_not_the_training_ones(captured, tmp_path):
    rows = {"train_loss": 2000, "eval_loss": 50}  # each row names the data it was computed on
    curve = pd.DataFrame([dict(pe="learned", metric=m, step=20, value=1.0, dataset="imdb", layers=1,
                               width=8, context=16, tokenizer="bpe", vocab_size=300, rows=n)
                          for m, n in rows.items()])
    csv = tmp_path / "curve.csv"
    curve.to_csv(csv, index=False)
    training.lm_curve(csv, tmp_path / "c.png")
    assert "held-out: 50 test reviews" in captured[0].axes[0].get_title()


def _two_line_figure():
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2)
    fig.suptitle("what is plotted\nmodel, dataset/split, 5 texts")
    axes[0].set_title("left panel\nits provenance")
    axes[1].set_title("one line")
    axes[0].plot([0, 1], [0, 1])
    return fig


def test_save_writes_every_format_asked_and_short_titles_keep_the_full_ones(tmp_path):
    """--format png,pdf,svg: three files, each what its suffix says; --short-titles: one-line
    titles on the figure, the full titles in <name>.json."""
    import json

    with style.figure_output("png,pdf,svg", short_titles=True):
        first = style.save(_two_line_figure(), tmp_path / "fig.png")
    assert first == tmp_path / "fig.png"
    assert (tmp_path / "fig.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "fig.pdf").read_bytes()[:5] == b"%PDF-"
    assert b"<svg" in (tmp_path / "fig.svg").read_bytes()[:2000]
    side = json.loads((tmp_path / "fig.json").read_text())
    assert side["titles"] == ["what is plotted\nmodel, dataset/split, 5 texts", "left panel\nits provenance",
                              "one line"]
    svg = (tmp_path / "fig.svg").read_text()
    assert "what is plotted" in svg and "model, dataset/split" not in svg and "its provenance" not in svg


def test_save_default_is_png_alone_with_full_titles_and_pdf_is_reproducible(tmp_path):
    style.save(_two_line_figure(), tmp_path / "a.png")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png"]
    with style.figure_output("pdf"):
        style.save(_two_line_figure(), tmp_path / "b.png")
        style.save(_two_line_figure(), tmp_path / "c.png")
    assert not (tmp_path / "b.png").exists()
    assert (tmp_path / "b.pdf").read_bytes() == (tmp_path / "c.pdf").read_bytes()


def test_figure_output_cli_over_preset_and_bad_formats_refused():
    from pecli.runs.errors import ConfigError

    with style.figure_output("svg"), style.figure_output("pdf", True, default=True):
        assert style.formats() == ("svg",) and style.short_titles() is True
    with style.figure_output(None), style.figure_output("pdf", default=True):
        assert style.formats() == ("pdf",)
    assert style.formats() == ("png",) and style.short_titles() is False
    assert style.parse_formats(["png, PDF", "png"]) == ("png", "pdf")
    for bad in ("jpg", "", "png,eps"):
        with pytest.raises(ConfigError, match="not a figure format"):
            style.parse_formats(bad)


def test_every_figure_is_written_through_the_one_saver():
    """No module draws around pecli.plots.style.save, so every figure honours --format and
    --short-titles (a new plotting module included)."""
    from pathlib import Path

    root = Path(style.__file__).resolve().parents[1]
    around = [str(p.relative_to(root)) for p in root.rglob("*.py")
              if p.name != "style.py" and ".savefig(" in p.read_text(encoding="utf-8")]
    assert not around, f"figures saved around style.save: {around}"


@pytest.mark.slow
def test_every_committed_experiments_figures_can_be_written_as_pdf(tmp_path):
    """One section per experiment of the committed offline results, drawn again as PDF (and
    SVG) alone: every figure function writes what --format asks."""
    import json
    from pathlib import Path

    from pecli.experiments import load_all
    from pecli.experiments.reproduce import load_preset

    root = Path(style.__file__).resolve().parents[2] / "results" / "offline"
    experiments, seen = load_all(), set()
    for entry in load_preset("offline").entries:
        if entry.experiment in seen or not (root / entry.id / "done.json").exists():
            continue
        seen.add(entry.experiment)
        done = json.loads((root / entry.id / "done.json").read_text())
        tables = {name: root / entry.id / file for name, file in done["tables"].items()}
        with style.figure_output("pdf,svg"):
            drawn = experiments.get(entry.experiment).figures(tables, tmp_path / entry.id)
        assert drawn, entry.id
        for fig in drawn:
            assert fig.suffix == ".pdf" and fig.read_bytes()[:5] == b"%PDF-", fig
            assert fig.with_suffix(".svg").exists() and not fig.with_suffix(".png").exists()
    # every experiment of the preset was drawn (the reproduce test checks each has results)
    assert {entry.experiment for entry in load_preset("offline").entries} == seen
    assert {"ablate", "perplexity", "mc", "length", "passkey", "toy", "toy-length", "train-lm"} <= seen


def test_titles_name_a_file_by_its_name_and_count_in_words():
    rows = pd.DataFrame({"model": ["m"], "dataset": ["/home/u/mydoc.csv"], "split": ["file"], "rows": [1]})
    assert style.title(rows, "NLL") == "NLL\nm, mydoc.csv, 1 text"
    rows = rows.assign(dataset="imdb", split="test", rows=20)
    assert style.title(rows, "cosine") == "cosine\nm, imdb/test, 20 texts"
    assert style.data_label(rows.iloc[0], "document") == "imdb/test, 20 documents"


def test_attn_distance_keeps_encoders_and_decoders_apart_one_colour_per_condition(monkeypatch, tmp_path):
    """attn_distance.png (issue 44 §4): lines, not bars; a panel for decoders and one for
    encoders; each condition's colour the palette's, whatever the model."""
    from pecli.plots import attn

    figs = []
    monkeypatch.setattr(attn, "save", lambda fig, path, dpi=150: figs.append(fig) or path)
    rows = [{"model": m, "causal": causal, "intervention": iv, "mask": "default", "mask_semantics": "legacy",
             "rope_scaling": "none", "head": -1, "layer": 0, "distance_low": lo, "distance_high": hi,
             "value": 0.1 + 0.01 * lo}
            for m, causal in (("smollm2", True), ("minilm", False))
            for iv in ("intact", "zero") for lo, hi in ((0, 1), (1, 2), (2, 4))]
    attn.distance(pd.DataFrame(rows), tmp_path / "d.png")
    fig = figs[0]
    assert [ax.get_title() for ax in fig.axes] == ["decoders (causal)", "encoders"]
    for ax in fig.axes:
        assert not ax.patches  # no bars
        colours = {line.get_label().split(": ")[1]: mcolors.to_hex(line.get_color()) for line in ax.lines}
        assert colours == {c: mcolors.to_hex(style.color_of(c)) for c in ("intact", "zero")}
        assert "log2" in ax.get_xlabel()


def test_attn_heads_draw_the_first_condition_unless_all_panels_are_asked_for(monkeypatch, tmp_path):
    """attn_heads.png reads at a column's width: the first condition's panels, the title saying
    how many there are; --all-panels (figure_output(all_panels=True)) draws every one."""
    from pecli.plots import attn

    figs = []
    monkeypatch.setattr(attn, "save", lambda fig, path, dpi=150: figs.append(fig) or path)
    rows = [{"model": "m", "intervention": iv, "mask": "default", "mask_semantics": "legacy",
             "rope_scaling": "none", "scope": "head", "layer": layer, "head": head, "metric": metric,
             "value": 0.5, "epsilon": 0.3, "rows": 4, "length": 8, "dataset": "imdb"}
            for iv in ("intact", "zero") for layer in range(2) for head in range(2)
            for metric in ("first_token_mass", "mean_distance", "entropy")]
    attn.heads(pd.DataFrame(rows), tmp_path / "h.png")
    with style.figure_output(all_panels=True):
        attn.heads(pd.DataFrame(rows), tmp_path / "h.png")
    summary, every = (len([ax for ax in f.axes if ax.get_label() != "<colorbar>"]) for f in figs)
    assert (summary, every) == (3, 6)
    assert "the first of 2 conditions; --all-panels" in figs[0]._suptitle.get_text()
    assert "--all-panels" not in figs[1]._suptitle.get_text()


def _tune_curve(intact: float) -> pd.DataFrame:
    """A tune_curve as pecli tune writes it: four settings of two parameters on one window."""
    rows = [{"setting": f"G={g} W={w}", "group": g, "window": w, "value": v, "ci_low": float("nan"),
             "ci_high": float("nan"), "diff_vs_intact": v - intact, "chosen": v == 41.0,
             "tuned": "selfextend", "metric": "perplexity", "units": 1, "unit": "window",
             "length": 16384, "model": "smollm2", "dataset": "imdb", "split": "test", "rows": 49,
             "dtype": "float32", "random_init": False}
            for (g, w), v in zip([(4, 1024), (4, 2048), (8, 1024), (8, 2048)], [41.4, 41.0, 42.0, 41.1],
                                 strict=True)]
    return pd.DataFrame(rows)


def test_tune_figure_keeps_the_settings_apart_when_intact_is_far_off(captured):
    """Intact at 90 beside settings at 41-42: a line there would flatten their differences, so
    the legend gives its value instead; near the settings it is the dashed line."""
    tune.one_parameter(_tune_curve(90.28), None, "group", "far.png")
    ax = captured[-1].axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "intact (choice split): 90.28, above the axis" in labels and ax.get_ylim()[1] < 45
    assert "1 window of 16,384 tokens" in ax.get_title()
    tune.one_parameter(_tune_curve(42.5), None, "group", "near.png")
    ax = captured[-1].axes[0]
    assert "intact (choice split)" in [t.get_text() for t in ax.get_legend().get_texts()]
    assert 42.5 in [line.get_ydata()[0] for line in ax.get_lines() if line.get_linestyle() == "--"]


def test_tune_report_numbers_share_decimals_enough_for_the_narrowest_interval():
    report = pd.DataFrame({"role": ["intact", "best"], "condition": ["intact", "selfextend:4:2048"],
                           "setting": ["intact", "G=4 W=2048"],
                           "value": [82.5796, 38.1111], "ci_low": [80.4066, 37.058],
                           "ci_high": [84.8, 39.2433], "diff_vs_intact": [float("nan"), -44.4686],
                           "diff_ci_low": [float("nan"), -45.8006], "diff_ci_high": [float("nan"), -43.2586],
                           "diff_vs_default": [float("nan"), 0.07881],
                           "diff_default_ci_low": [float("nan"), 0.0438],
                           "diff_default_ci_high": [float("nan"), 0.1168]})
    lines = tune._report_text(report)  # the narrowest width, 0.073, needs 3 decimals
    assert lines[0] == "intact: 82.580 [80.407, 84.800]"  # not "intact (intact)"
    assert lines[1].startswith("best (G=4 W=2048): 38.111")
    assert lines[1].endswith("vs intact -44.469 [-45.801, -43.259]; vs default +0.079 [+0.044, +0.117]")


def test_tune_report_gives_one_line_where_the_default_is_chosen():
    nan = float("nan")
    report = pd.DataFrame({"role": ["intact", "default", "best"], "condition": ["intact", "yarn:2", "yarn:2"],
                           "setting": ["intact", "factor=2", "factor=2"], "value": [82.58, 39.78, 39.78],
                           "ci_low": [80.41, 38.67, 38.67], "ci_high": [84.80, 40.94, 40.94],
                           "diff_vs_intact": [nan, -42.80, -42.80], "diff_ci_low": [nan, -44.10, -44.10],
                           "diff_ci_high": [nan, -41.62, -41.62], "diff_vs_default": [nan, nan, 0.0],
                           "diff_default_ci_low": [nan, nan, nan], "diff_default_ci_high": [nan, nan, nan]})
    assert tune._report_text(report) == [
        "intact: 82.58 [80.41, 84.80]",
        "default, also the best (factor=2): 39.78 [38.67, 40.94]; vs intact -42.80 [-44.10, -41.62]"]


@pytest.mark.parametrize("tasks, shape", [(4, (2, 2)), (3, (1, 3)), (5, (2, 3))])
def test_ruler_figure_fills_its_grid_of_task_panels(captured, tasks, shape):
    """Four tasks on a 2 x 2 grid (three columns would leave two panels empty); every task a
    panel with its lengths along the bottom, past the context starred."""
    rows = [{"task": f"task{t}", "length": n, "value": 0.5, "ci_low": 0.3, "ci_high": 0.7,
             "model": "smollm2", "condition": "intact", "intervention": "intact", "context": 8192,
             "samples": 20, "haystack": "imdb/test", "dtype": "float32"}
            for t in range(tasks) for n in (4096, 16384)]
    ruler.by_length(pd.DataFrame(rows), "ruler.png")
    used = [ax for ax in captured[-1].axes if ax.axison]
    assert len(used) == tasks and len(captured[-1].axes) == shape[0] * shape[1]
    assert [t.get_text() for t in used[0].get_xticklabels()] == ["4,096", "16,384*"]
    assert used[-1].get_xlabel() == "length (tokens; * past the context)"
    ruler.by_length(pd.DataFrame(rows).query("length == 4096"), "inside.png")
    assert [ax.get_xlabel() for ax in captured[-1].axes if ax.axison][-1] == "length (tokens)"


def test_ruler_figure_puts_each_tasks_paired_differences_under_it(captured):
    """With a remedy beside intact, every task's panel has a panel under it: the remedy's
    difference from intact with its paired interval, around a zero line."""
    nan = float("nan")
    rows = [{"task": f"task{t}", "length": n, "value": v, "ci_low": v - 0.2, "ci_high": v + 0.2,
             "model": "smollm2", "condition": c, "intervention": c, "context": 8192, "samples": 20,
             "haystack": "imdb/test", "dtype": "float32", "diff_vs_intact": d, "diff_ci_low": d - 0.25,
             "diff_ci_high": d + 0.2}
            for t in range(3) for n in (8192, 16384)
            for c, v, d in (("intact", 0.3, nan), ("selfextend:4:2048", 0.5, 0.2 if n == 8192 else 0.5))]
    ruler.by_length(pd.DataFrame(rows), "ruler.png")
    used = [ax for ax in captured[-1].axes if ax.axison]
    assert len(used) == 6 and [ax.get_title() for ax in used[:3]] == ["task0", "task1", "task2"]
    for ax in used[3:]:  # the row under the tasks: one point per length, bars from the paired interval
        bars = ax.containers[0]
        assert list(bars.lines[0].get_ydata()) == [0.2, 0.5]
        assert [tuple(s[:, 1]) for s in bars.lines[2][0].get_segments()] == [
            pytest.approx((-0.05, 0.4)), pytest.approx((0.25, 0.7))]
        assert any(list(line.get_ydata()) == [0, 0] for line in ax.get_lines())
    assert used[-1].get_xlabel() == "length (tokens; * past the context)" and used[0].get_xlabel() == ""
