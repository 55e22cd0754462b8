"""Each option is declared once: a command's flags are derived from its options class
(pecli.cli.flags.derived), help text, type and default from the field."""

import dataclasses
import inspect
import typing

import pytest
import typer
from typer.testing import CliRunner

from pecli.cli.app import app
from pecli.cli.flags import flag
from pecli.experiments.options.ablate import AblateOptions
from pecli.experiments.options.length import LengthOptions
from pecli.experiments.options.perplexity import PerplexityOptions
from pecli.runs.fields import Options


def _commands(group=app):
    for info in group.registered_commands:
        yield info.callback
    for sub in group.registered_groups:
        yield from _commands(sub.typer_instance)


def _classes(cls=Options):
    for sub in cls.__subclasses__():
        yield sub
        yield from _classes(sub)


def test_every_options_flag_is_a_field_a_deprecated_spelling_or_the_commands_own():
    derived = {c.__wrapped__.__name__: c for c in _commands() if hasattr(c, "__wrapped__")}
    assert {"perplexity", "ablate", "length", "attn", "lm_eval", "fit", "recover", "lm"} <= set(derived)
    for cls in {c for c in _classes() if c.FLAGS}:
        fields = {f.name for f in dataclasses.fields(cls)}
        for name in cls.FLAGS.split():
            assert name in fields or name in cls.RENAMED or name in ("out", "force", "save_models",
                                                                     "model_args", "output_path",
                                                                     "predict_only", "seed"), (cls, name)


def test_a_flags_help_is_its_fields():
    """The help text shown is the one on the field (written nowhere else)."""
    field = {f.name: f for f in dataclasses.fields(PerplexityOptions)}["stride"]
    info = typing.get_args(flag(PerplexityOptions, "stride").annotation)[1]
    assert info.help == field.metadata["help"] and "Window step" in info.help
    result = CliRunner().invoke(app, ["perplexity", "--help"], env={"COLUMNS": "300"})
    assert "Window step for --long-text window" in result.output


def test_defaults_shown_and_unset_follow_the_field():
    # a scalar shows the options' default; a flag marked unset shows none and takes it when absent
    assert flag(PerplexityOptions, "dataset").default == PerplexityOptions.dataset == "truthfulqa"
    assert flag(LengthOptions, "buckets").default is None
    assert LengthOptions.build({}, "t").buckets == 8
    # several names: the MODELS argument, required
    models = flag(LengthOptions, "model")
    assert models.name == "models" and models.default is inspect.Parameter.empty
    assert isinstance(typing.get_args(models.annotation)[1], typer.models.ArgumentInfo)


def test_a_deprecated_spelling_is_a_hidden_flag_that_warns():
    pe = flag(AblateOptions, "pe")
    info = typing.get_args(pe.annotation)[1]
    assert info.hidden and info.help == "Deprecated: use --intervention."
    with pytest.warns(FutureWarning, match="'pe' is deprecated"):
        assert [c.name for c in AblateOptions.build({"pe": "shuffle"}, "t").intervention] == ["shuffle"]
