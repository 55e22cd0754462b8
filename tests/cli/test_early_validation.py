"""A typo in any name-valued option, or a count out of range, fails with one `error:` line
before any model or data loads (issue 15): loading is patched to fail the test if reached.

Dataset names are checked by `pecli.data.datasets.load_data` itself, before it reads a file, so for
`--dataset` typos only the model loader is patched.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from pecli.cli.app import app

runner = CliRunner()


def _never(*args, **kwargs):
    raise AssertionError("loaded before the options were checked")


@pytest.fixture
def no_loading(monkeypatch, tmp_path):
    monkeypatch.setattr("pecli.models.loading.load_model", _never)
    monkeypatch.setattr("pecli.data.datasets.load_data", _never)
    monkeypatch.setattr("pecli.measures.training.build_model", _never)
    monkeypatch.chdir(tmp_path)  # default output folders land here


ABLATE = ["ablate", "random:bert"]
PPL = ["perplexity", "random:gpt2"]
MC = ["mc", "random:gpt2"]
PROBE = ["pe", "probe", "random:bert"]
RECOVER = ["pe", "recover", "random:bert"]
SINUSOID = ["pe", "sinusoidal"]
TOY = ["toy", "arithmetic", "--max", "9"]
TRAIN = ["train", "lm"]
DEVICE_DTYPE_SEED = [["--device", "cdua"], ["--dtype", "float23"], ["--seed", "-1"]]

CASES = [
    *[ABLATE + a for a in [["--intervention", "nosuch"], ["--pe", "zero,shufle"], ["--limit", "0"],
                           ["--bootstrap", "-1"], ["--baseline-pairs", "0"], *DEVICE_DTYPE_SEED]],
    *[PPL + a for a in [["--pe", "nosuch"], ["--intervention", "nosuch"], ["--intervention", "shift"],
                        ["--mask", "linaer"], ["--mask-semantics", "log-bais"], ["--stride", "4"],
                        ["--protocol", "studdy"], ["--long-text", "windw"], ["--stride", "0"],
                        ["--limit", "0"], ["--bootstrap", "-1"], *DEVICE_DTYPE_SEED]],
    *[MC + a for a in [["--pe", "nosuch"], ["--intervention", "shift:x"], ["--mask", "linaer"],
                       ["--mask-semantics", "log-bais"], ["--mask", "linear,self:2"],
                       ["--protocol", "studdy"], ["--limit", "0"], ["--bootstrap", "-1"],
                       *DEVICE_DTYPE_SEED]],
    *[PROBE + a for a in [["--intervention", "nosuch"], ["--limit", "0"], ["--folds", "1"],
                          ["--max-length", "1"], ["--pairs", "0"], ["--max-memory", "0=1GiB"],
                          ["--text", "a", "--text-field", "b"],
                          *DEVICE_DTYPE_SEED]],
    *[RECOVER + a for a in [["--limit", "0"], ["--n-boot", "-1"], ["--bootstrap", "-1"],
                            ["--tokens", "3"], ["--top-k", "1"], ["--folds", "1"],
                            *DEVICE_DTYPE_SEED]],
    *[SINUSOID + a for a in [["--dim", "7"], ["--positions", "0"], ["--base", "1"]]],
    *[TOY + a for a in [["--pe", "nosuch"], ["--steps", "0"], ["--seed", "-1"], ["--max", "1"],
                        ["--probe", "9+1="], ["--width", "10"], ["--layers", "0"],
                        ["--threads", "0"]]],
    ["toy", "arithmetc"],
    # --format: every command that draws takes it, checked before anything runs
    *[cmd + ["--format", "jpg"] for cmd in (ABLATE, PPL, MC, PROBE, RECOVER, SINUSOID, TOY, TRAIN,
                                            ["length", "random:llama"], ["passkey", "random:llama"],
                                            ["compare", "."], ["reproduce"])],
    *[TRAIN + a for a in [["--pe", "nosuch"], ["--tokenizer", "bep"], ["--limit", "0"],
                          ["--seed", "-1"], ["--vocab", "10"], ["--width", "10"],
                          ["--context", "1"], ["--eval-every", "0"],
                          ["--pe", "learned,none", "--model-out", "m"]]],
    # sizes and layers the model's config decides (issue 36's sweep): refused before loading
    ["length", "random:llama", "--intervention", "zero@99"],
    ["finetune", "random:bert", "--train-layers", "99"],
    ["attn", "random:gpt2", "--buckets", "100000"],
    # issue 46: a number checked only by a bound lets NaN/inf through; a shift past float32's
    # exact positions equals `zero`
    *[["length", "random:llama", "--intervention", i] for i in (
        "lminfinite:4:16:nan", "lminfinite:4:16:inf", "rerope:16:nan", "rerope:16:-inf",
        "droplow:nan", "drophigh:inf", "shift:-99999999999", "shift:1048577")],
    # options that do not apply to the model the config names, refused, not recorded and ignored
    *[["finetune", "random:bert", *a] for a in (["--steps", "5"], ["--eval-every", "3"])],
    *[["finetune", "random:gpt2", *a] for a in (["--train-layers", "1"], ["--head-lr", "0.5"],
                                                 ["--epochs", "2"])],
    *[[cmd, "random:llama", "--rope-scaling-on", "intact"] for cmd in ("length", "passkey")],
    # transformers' rope types and their keys: the condition's check before loading
    *[[cmd, "random:llama", "--rope-scaling", r] for cmd in ("length", "passkey", "attn", "ruler")
      for r in ("yran:2", "llama3:8", '{"rope_type": "yarn", "factor": 2, "twist": 1}')],
    # what the config alone decides: a length past a learned table (every row would be "not
    # applicable")
    ["attn", "random:bert", "--length", "1000"],
    # the tokenizer and config alone decide (issue 46 §3): a length shorter than the passkey
    # template, or past a table with no row past it (MPT's ALiBi, GPT-J's sin/cos: they crashed)
    *[["passkey", model, "--lengths", n] for model, n in (
        ("random:llama", "10"), ("random:llama", "8,12"), ("random:gpt2", "10,2000"),
        ("random:mpt", "3000"), ("random:gptj", "3000,5000"))],
    *[["ruler", model, "--lengths", n, "--tasks", "niah_single_1"] for model, n in (
        ("random:mpt", "3000"), ("random:gptj", "4096"), ("random:gpt2", "2000"))],
    ["ruler", str(Path(__file__).resolve().parents[2] / "models" / "gpt2-imdb"), "--lengths", "256"],
    *[["attn", model, "--length", "3000"] for model in ("random:mpt", "random:gptj")],
]


@pytest.mark.parametrize("args", CASES, ids=" ".join)
def test_a_bad_option_fails_before_loading(no_loading, args):
    result = runner.invoke(app, args)
    assert result.exit_code != 0, result.output
    assert not isinstance(result.exception, AssertionError), "loaded before checking " + " ".join(args)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output


@pytest.mark.parametrize("args,words", [
    (["passkey", "random:llama", "--lengths", "10"], "give lengths of at least {first} tokens"),
    (["passkey", "random:gpt2", "--lengths", "10,1015"], "give lengths from {first} to 1014 tokens"),
    (["passkey", "random:gptj", "--lengths", "2039"], "give lengths from {first} to 2038 tokens"),
    (["ruler", "random:mpt", "--lengths", "2049", "--tasks", "vt"], "give lengths of at most 2048"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_a_run_of_only_not_applicable_rows_names_the_lengths_that_work(no_loading, args, words):
    """The smallest length is the tokenizer's (counted by measures.passkey.shortest, tested
    against `fit`), the largest the table's less the answer's 10 tokens (passkey) or the
    table's own (ruler, whose lengths count the new tokens)."""
    from pecli.measures.passkey import shortest
    from pecli.models.loading import load_tokenizer

    first = shortest(load_tokenizer(args[1]), 0, (0.0, 0.5, 1.0), 5, False)  # the defaults
    result = runner.invoke(app, args)
    assert result.exit_code == 1 and not isinstance(result.exception, AssertionError), result.output
    assert words.format(first=first) in result.output, result.output


@pytest.mark.parametrize("args", [["perplexity", "random:bloom", "--mask", "linear"],
                                  ["mc", "random:mpt", "--mask", "linear"],
                                  ["length", "random:gptj", "--mask", "linear", "--lengths", "8", "--buckets", "4"]],
                         ids=" ".join)
def test_a_mask_on_a_model_with_its_own_attention_fails_before_loading(no_loading, args):
    result = runner.invoke(app, args)
    assert result.exit_code == 1 and not isinstance(result.exception, AssertionError), result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    assert "masks do not apply" in lines[0] and args[1] in lines[0]


@pytest.mark.parametrize("args", [["length", "random:gptj", "--rope-scaling", "linear:2"],
                                  ["passkey", "random:gptj", "--rope-scaling", "yarn:2"],
                                  ["length", "random:bloom", "--rope-scaling", "linear:2"]],
                         ids=" ".join)
def test_rope_scaling_without_a_rotary_module_fails_before_loading(no_loading, args):
    result = runner.invoke(app, args)
    assert result.exit_code == 1 and not isinstance(result.exception, AssertionError), result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "rope-scaling" in lines[0], result.output


@pytest.mark.parametrize("args", [ABLATE + ["--dataset", "imbd"], PPL + ["--dataset", "truthfulq"],
                                  PROBE + ["--dataset", "imbd"], RECOVER + ["--dataset", "imbd"]],
                         ids=" ".join)
def test_a_dataset_typo_fails_before_the_model_loads(monkeypatch, tmp_path, args):
    monkeypatch.setattr("pecli.models.loading.load_model", _never)
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, args)
    assert result.exit_code == 1 and not isinstance(result.exception, AssertionError), result.output
    assert result.output.strip().startswith("error:") and "imdb" in result.output


PRESET = """
name: t
experiments:
  - id: fine
    experiment: ablate
    options: {{model: random:bert}}
  - id: typo
    experiment: {experiment}
    options: {{{options}}}
"""


@pytest.mark.parametrize("experiment,options", [
    ("ablate", "model: random:bert, interventions: [nosuch]"),
    ("ablate", "model: random:bert, interventions: 'zero,shufle'"),
    ("ablate", "model: random:bert, seed: -1"),
    ("pe-probe", "models: [random:bert], interventions: [zero, nosuch]"),
    ("mc", "model: random:gpt2, pe: [nosuch]"),
    ("mc", "model: random:gpt2, semantics: legacy, masks: 'linear,linaer'"),
    ("pe-probe", "models: [random:bert], intervention: [zero, nosuch]"),
    ("pe-probe", "models: [random:bert], folds: 1"),
    ("pe-recover", "models: [random:bert], bootstrap: -1"),
    ("pe-recover", "models: [random:bert], text: text, top_k: 1"),
    ("pe-sinusoidal", "dim: 7"),
    ("toy", "pe: [learned, nosuch]"),
    ("toy", "max_n: 10, probe: '12+1='"),
    ("train-lm", "pe: [nosuch]"),
    ("train-lm", "width: 10, heads: 4"),
    ("perplexity", "model: random:gpt2, semantics: [log-bais]"),
    ("perplexity", "model: random:gpt2, mask_semantics: [log-bais]"),
    ("perplexity", "model: random:gpt2, intervention: [zero, nosuch], start_token: maybe"),
    ("perplexity", "model: random:gpt2, stride: 4"),
    ("mc", "model: random:gpt2, intervention: zero, mask: [linear, linaer]"),
    ("perplexity", "model: random:gpt2, masks: [linaer]"),
    ("perplexity", "model: random:gpt2, protocol: [studdy]"),
    ("perplexity", "model: random:gpt2, long_text: windw"),
    ("perplexity", "model: random:gpt2, limit: 0"),
    ("perplexity", "model: random:gpt2, limit: four"),
    ("length", "model: random:llama, rope_scaling: 'yarn:2,yran:2'"),  # transformers' types: preflight
    ("passkey", "model: random:llama, rope_scaling: 'llama3:8'"),
])
def test_a_preset_typo_fails_before_anything_runs(no_loading, tmp_path, experiment, options):
    """The second entry's typo stops the preset before the first entry loads anything."""
    path = tmp_path / "p.yaml"
    path.write_text(PRESET.format(experiment=experiment, options=options))
    result = runner.invoke(app, ["reproduce", "--preset", str(path), "--out", str(tmp_path / "o")])
    assert result.exit_code == 1 and not isinstance(result.exception, AssertionError), result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    assert "typo" in lines[0] or experiment in lines[0], result.output


@pytest.mark.parametrize("donor,message", [
    ({"model_type": "bert", "hidden_size": 32}, "width 32 does not match"),
    ({"model_type": "llama", "hidden_size": 64}, "has rotary positions, no embedding rows to lend"),
])
def test_swap_is_checked_against_the_donors_config_before_loading(no_loading, tmp_path, donor, message):
    """What the configs alone decide (`swap:` between different widths, a donor without a
    position table) fails after the configs are read, before data or weights load."""
    import json

    for name, config in (("model", {"model_type": "bert", "hidden_size": 64}), ("donor", donor)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
    result = runner.invoke(app, ["ablate", str(tmp_path / "model"), "--intervention",
                                 f"zero,swap:{tmp_path / 'donor'}"])
    assert result.exit_code == 1 and not isinstance(result.exception, AssertionError), result.output
    assert result.output.startswith("error:") and message in result.output, result.output


def test_a_deprecated_flag_beside_its_new_name_is_one_error(no_loading):
    result = runner.invoke(app, [*RECOVER, "--n-boot", "5", "--bootstrap", "7"])
    assert result.exit_code == 1, result.output
    assert "'n_boot' and 'bootstrap' are the same option; give one" in result.output


@pytest.mark.parametrize("args", [["finetune", "random:bert", "--model-out", "afile"],
                                  ["finetune", "random:bert", "--model-out", "afile/sub"],
                                  ["mask", "fit", "random:gpt2", "--eval-data", "nosuch.csv"]],
                         ids=" ".join)
def test_an_output_or_held_out_file_is_checked_before_the_model_loads(monkeypatch, tmp_path, args):
    """--model-out under a file, or a held-out data file that is not there: one line before the
    weights load (the training data may be read first; the model is never loaded)."""
    monkeypatch.setattr("pecli.models.loading.load_model", _never)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("not a folder")
    result = runner.invoke(app, [*args, "--limit", "4"])
    assert result.exit_code != 0 and not isinstance(result.exception, AssertionError), result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    assert ("afile" in lines[0] and "not a folder" in lines[0]) or "nosuch.csv" in lines[0], lines


def _mask_file(path, **changes) -> str:
    """A slope mask file for gpt2's 12 heads, with `changes` to its fields."""
    import json

    raw = {"format": "pecli-mask/1", "form": "slope", "semantics": "log-bias", "heads": 12,
           "parameters": 12, "edges": [], "values": [[0.1]] * 12, "fitted": {}, **changes}
    path.write_text(json.dumps(raw))
    return str(path)


@pytest.mark.parametrize("changes,message", [
    ({"values": [[float("nan")]] * 12}, "not finite"),
    ({"values": [[float("inf")]] * 12}, "not finite"),
    ({"values": [[-0.5]] * 12}, "negative slope"),
    ({"values": [["0.1"]] * 12}, "not rows of numbers"),
    ({"values": [[True]] * 12}, "not rows of numbers"),
    ({"values": [[0.1]] * 3}, "has 3 rows"),
    ({"form": "linear", "values": [[1.5]] * 12}, "outside [0, 1]"),
    ({"form": "bucket", "values": [[0.0, 1.0]], "edges": [0, 5, 2]}, "bucket edges"),
    ({"heads": 0}, "not a positive integer"),
    ({"heads": 4, "values": [[0.1]] * 4}, "fitted per head for 4 heads; random:gpt2 has 12"),
    ({"semantics": "log-bais"}, "has semantics"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_a_bad_mask_file_fails_before_loading(no_loading, tmp_path, changes, message):
    """Issue 46 §1/§3: NaN, a negative slope, values that are not numbers or for another head
    count than the model's config: one line before any weights load, never `nan [a, b]`."""
    mask = _mask_file(tmp_path / "m.json", **changes)
    for cmd in (PPL, ["length", "random:gpt2", "--lengths", "16"]):
        result = runner.invoke(app, [*cmd, "--mask", mask])
        assert result.exit_code == 1 and not isinstance(result.exception, AssertionError), result.output
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], result.output


def test_a_mask_file_runs_under_its_own_semantics(no_loading, tmp_path):
    """Issue 46 §1: a log-bias file given back without --mask-semantics runs as log-bias (not
    the default legacy); a contradicting --mask-semantics is refused."""
    from pecli.experiments.options.perplexity import PerplexityOptions
    from pecli.positions.conditions import grid

    mask = _mask_file(tmp_path / "m.json")
    built = PerplexityOptions.build({"model": "random:gpt2", "intervention": ["zero"], "mask": [mask]}, "test")
    files = [c for c in grid(built) if c.mask.name == "file"]
    assert files and {c.mask_semantics.name for c in files} == {"log-bias"}
    for semantics in ("boolean", "legacy"):  # legacy, the default, given explicitly contradicts too
        for cmd in (PPL, ["lm-eval", "random:gpt2", "--tasks", "truthfulqa_mc1"]):
            result = runner.invoke(app, [*cmd, "--mask", f"linear,{mask}", "--mask-semantics", semantics])
            lines = [line for line in result.output.splitlines() if line.strip()]
            assert result.exit_code == 1 and len(lines) == 1 and "fitted with log-bias semantics" \
                in lines[0] and f"drop --mask-semantics {semantics}" in lines[0], result.output
    both = PerplexityOptions.build({"model": "random:gpt2", "mask": ["linear", mask],
                                    "mask_semantics": ["legacy", "log-bias"]}, "test")
    assert {(c.mask.name, c.mask_semantics.name) for c in grid(both)} >= {
        ("linear", "legacy"), ("linear", "log-bias"), ("file", "log-bias")}
    assert ("file", "legacy") not in {(c.mask.name, c.mask_semantics.name) for c in grid(both)}
    unset = PerplexityOptions.build({"model": "random:gpt2", "mask": ["linear"]}, "test")
    assert [s.name for s in unset.mask_semantics] == ["legacy"]  # the default, as the sidecar says
    assert unset.replace(seed=1).mask_semantics == unset.mask_semantics
    assert [s.name for s in built.replace(seed=1).mask_semantics] == []  # each mask's own, kept


@pytest.mark.parametrize("args,checkpoint", [
    (["finetune", "random:bert", "--intervention", "zero", "--model-out", "m"], "m/zero/config.json"),
    (["train", "lm", "--pe", "learned", "--seeds", "1", "--model-out", "m"], "m/config.json"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_model_out_over_an_existing_checkpoint_needs_force(no_loading, tmp_path, args, checkpoint):
    """Issue 46 §1: the first run's checkpoint_revision must not point at weights replaced."""
    (tmp_path / checkpoint).parent.mkdir(parents=True)
    (tmp_path / checkpoint).write_text("{}")
    result = runner.invoke(app, args)
    assert result.exit_code == 1 and not isinstance(result.exception, AssertionError), result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "already holds a checkpoint" in lines[0] and "--force" in lines[0], lines
    result = runner.invoke(app, [*args, "--force"])  # past the check: the (patched) loading
    assert isinstance(result.exception, AssertionError), result.output
