"""Options objects (issue 15): built once from flags or a preset, checked when built, frozen."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap

import pytest

from pecli.experiments.options.ablate import AblateOptions
from pecli.experiments.options.perplexity import PerplexityOptions
from pecli.runs import names
from pecli.runs.config import load_preset
from pecli.runs.errors import ConfigError, InterventionError


def test_names_are_parsed_into_registry_choices_and_given_back_as_strings():
    o = AblateOptions.build({"intervention": "zero, shift:3,zero", "model": "minilm"}, "t")
    assert [c.term for c in o.intervention] == [names.INTERVENTIONS.get("zero"),
                                                names.INTERVENTIONS.get("shift")]
    assert o.intervention[1].argument == "3"
    assert o.as_dict()["intervention"] == ["zero", "shift:3"]  # repeats dropped, order kept
    again = AblateOptions.build(json.loads(json.dumps(o.as_dict())), "t")
    assert again == o  # a sidecar's options rebuild the same object


def test_options_are_frozen():
    o = AblateOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.limit = 3


@pytest.mark.parametrize("values,error,message", [
    ({"intervention": "nosuch"}, InterventionError, "t: intervention (--intervention): unknown intervention 'nosuch'"),
    ({"intervention": "shift"}, InterventionError, "needs an argument: write shift:K"),
    ({"intervention": "shift:x"}, InterventionError, "shift needs an integer, got 'x'"),
    ({"intervention": "zero:1"}, InterventionError, "takes no argument"),
    ({"intervention": "intact"}, ConfigError, "`intact` is the baseline"),
    ({"intervention": 3}, ConfigError, "not a name or a list of names"),
    ({"limit": "four"}, ConfigError, "limit (--limit): 'four' is not an integer or null"),
    ({"limit": 0}, ConfigError, "limit (--limit): 0 is out of range (at least 1)"),
    ({"seed": 2**32}, ConfigError, "at most 4294967295"),
    ({"probe": "yes"}, ConfigError, "probe (--probe): 'yes' is not true or false"),
    ({"device": "cdua"}, ConfigError, "unknown device 'cdua'"),
    ({"dtype": "float23"}, ConfigError, "did you mean 'float32'"),
    ({"max_memory": "0=1GiB"}, ConfigError, "needs device_map: auto"),
    ({"intervnetion": "zero"}, ConfigError, "unknown option 'intervnetion' (did you mean 'intervention'?)"),
    ({"interventions": "zero", "intervention": "zero"}, ConfigError, "are the same option"),
])
def test_every_mistake_is_one_error_naming_where_and_what(values, error, message):
    with pytest.raises(error) as info:
        AblateOptions.build(values, "t")
    assert message in str(info.value) and str(info.value).startswith("t: ")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("values,message", [
    ({"mask": "linaer"}, "unknown mask 'linaer' (did you mean 'linear'?)"),
    ({"mask_semantics": "log-bais"}, "unknown mask semantics 'log-bais'"),
    ({"protocol": "studdy"}, "unknown protocol 'studdy'"),
    ({"long_text": "windw"}, "did you mean 'window'"),
    ({"long_text": "truncate,window"}, "one long-text treatment, not 2"),
    ({"stride": 8}, "add --long-text window or drop --stride"),
    ({"stride": 0}, "stride (--stride): 0 is out of range"),
])
def test_perplexity_names_and_conflicts(values, message):
    with pytest.raises(ConfigError) as info:
        PerplexityOptions.build(values, "t")
    assert message in str(info.value)


def test_deprecated_names_still_work_with_a_warning():
    with pytest.warns(FutureWarning, match="'pe' is deprecated; use 'intervention'"):
        old = PerplexityOptions.build({"pe": "learned,zero", "masks": "linear",
                                       "semantics": "log-bias"}, "t")
    new = PerplexityOptions.build({"intervention": ["intact", "zero"], "mask": ["linear"],
                                   "mask_semantics": ["log-bias"]}, "t")
    assert old == new


def test_no_default_is_a_deprecated_name():
    """Every options class built from its defaults alone warns nothing: no default is a
    renamed spelling (attn's intervention once defaulted to 'learned', warning on every run)."""
    import importlib
    import pkgutil
    import warnings

    from pecli.experiments import options as package
    from pecli.experiments.options.attn import AttnOptions
    from pecli.runs.fields import Options

    modules = [importlib.import_module(f"{package.__name__}.{m.name}")
               for m in pkgutil.iter_modules(package.__path__)]
    classes = [c for module in modules for c in vars(module).values()
               if isinstance(c, type) and issubclass(c, Options) and dataclasses.is_dataclass(c)
               and c.__module__ == module.__name__]
    assert AttnOptions in classes and len(classes) > 10
    for cls in classes:
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            cls.build({}, "t")
    assert AttnOptions.build({}, "t").intervention == (names.parse(names.INTERVENTIONS, names.INTACT),)


def test_a_preset_builds_the_same_object_as_the_flags(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(textwrap.dedent("""
        experiments:
          - id: a
            experiment: ablate
            options: {model: minilm, interventions: [zero, shuffle], limit: 5}
    """))
    with pytest.warns(FutureWarning):
        entry = load_preset(str(path), experiments=_experiments()).entries[0]
    assert entry.built == AblateOptions.build(
        {"model": "minilm", "intervention": "zero,shuffle", "limit": 5}, "cli")
    assert entry.options == {"model": "minilm", "intervention": ["zero", "shuffle"], "limit": 5}
    # results saved before the renaming keep their key: the old spelling is recognised
    old = dataclasses.replace(entry, options={"model": "minilm", "limit": 5,
                                              "interventions": ["zero", "shuffle"]})
    assert old.key(2) in entry.keys(2) and entry.key(2) != old.key(2)


def test_a_changed_default_keys_an_entry_by_what_it_computes(tmp_path):
    """passkey's --draws went from fixed to independent (DEFAULTS_BEFORE). Results saved while an
    entry left it out drew fixed trials: an entry that names fixed still finds them, one that
    leaves it out (independent now) does not, and naming today's default is leaving it out."""
    import hashlib
    import json

    from pecli.experiments import EXPERIMENTS
    from pecli.experiments.passkey import run  # noqa: F401 (registers the experiment)
    from pecli.experiments.reproduce import load_preset

    version = EXPERIMENTS.get("passkey").version

    def entry(name, extra=""):
        path = tmp_path / f"{name}.yaml"
        path.write_text("experiments:\n  - {id: a, experiment: passkey, options: "
                        f"{{model: random:llama, trials: 2{extra}}}}}\n")
        return load_preset(str(path)).entries[0]

    blob = json.dumps({"experiment": "passkey", "version": version,
                       "options": {"model": "random:llama", "trials": 2}}, sort_keys=True)
    saved_before = hashlib.sha256(blob.encode()).hexdigest()[:16]  # the key before the change
    fixed, unsaid = entry("fixed", ", draws: fixed"), entry("unsaid")
    assert saved_before in fixed.keys(version) and fixed.key(version) != saved_before
    assert saved_before not in unsaid.keys(version)
    assert unsaid.key(version) == entry("independent", ", draws: independent").key(version) != fixed.key(version)


def test_a_preset_type_error_is_one_line(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("experiments:\n  - {id: a, experiment: ablate, options: {limit: four}}\n")
    with pytest.raises(ConfigError, match=r"experiments\[0\] \(ablate\): limit \(--limit\): 'four' is not"):
        load_preset(str(path), experiments=_experiments())


def test_a_bad_name_fails_without_importing_torch():
    """`pecli ablate smollm2 --intervention nosuch` never imports torch (so it fails in well
    under a second, whatever the cache holds)."""
    code = ("import sys\nfrom pecli.cli.app import app\n"
            "try:\n    app(['ablate', 'smollm2', '--intervention', 'nosuch'])\n"
            "except SystemExit as e:\n    code = e.code\n"
            "print(code, 'torch' in sys.modules, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["1", "False", "False"], out.stdout + out.stderr
    assert "unknown intervention 'nosuch'" in out.stderr


@pytest.mark.parametrize("args,message", [
    (["pe", "probe", "smollm2", "--intervention", "nosuch"], "unknown intervention 'nosuch'"),
    (["pe", "probe", "smollm2", "--folds", "1"], "folds (--folds): 1 is out of range"),
    (["pe", "recover", "smollm2", "--bootstrap", "-1"], "bootstrap (--bootstrap): -1 is out of range"),
    (["pe", "recover", "smollm2", "--tokens", "2"], "tokens (--tokens): 2 is fewer than the 5 folds"),
    (["pe", "sinusoidal", "--dim", "7"], "dim (--dim): 7 is odd"),
    (["toy", "arithmetic", "--pe", "rop"], "unknown position encoding 'rop'"),
    (["toy", "arithmetic", "--max", "10", "--probe", "21+1="], "probe (--probe): '21+1='"),
    (["train", "lm", "--pe", "alibi,nosuch"], "unknown position encoding 'nosuch'"),
    (["train", "lm", "--tokenizer", "bep"], "tokenizer (--tokenizer): unknown value 'bep'"),
    (["train", "lm", "--width", "10"], "--width 10 must be a multiple of --heads 4"),
])
def test_a_bad_option_of_the_pe_and_training_commands_fails_without_importing_torch(args, message):
    """pe probe / recover / sinusoidal, toy and train lm build their options before importing
    any experiment: a bad name or range fails without torch."""
    code = ("import sys\nfrom pecli.cli.app import app\n"
            f"try:\n    app({args!r})\n"
            "except SystemExit as e:\n    code = e.code\n"
            "print(code, 'torch' in sys.modules, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["1", "False", "False"], out.stdout + out.stderr
    assert message in out.stderr


def _experiments():
    from pecli.experiments import load_all

    return load_all()
