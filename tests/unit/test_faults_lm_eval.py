"""Fault injection, `pecli lm-eval` and the lm-eval model `pecli`: one rule for model_args,
passkey metadata checked as `pecli passkey` checks its flags, what lm-eval would cut refused,
the shots lm-eval used recorded, task folders and YAMLs that say what is wrong.

The rule for `pecli lm-eval --model_args`: pretrained= and HFLM's keys for a loaded model;
a key that sets the condition, seed, device, dtype or batch size is refused with its flag
(the flags cross conditions); any other key, a key given twice, an item without `=`, an
empty pretrained= and a value of the wrong kind are refused, all before anything loads.
"""

from __future__ import annotations

import pytest

from pecli.runs.errors import ConfigError

CONFIGS = "configs/lm_eval"


def _one_line(result, fragment: str) -> None:
    assert result.exit_code == 1 and not isinstance(result.exception, AssertionError), result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and fragment in lines[0], result.output


@pytest.fixture
def never_loads(monkeypatch):
    def loaded(*args, **kwargs):
        raise AssertionError("a model loaded before the input was refused")

    monkeypatch.setattr("pecli.models.loading.load_model", loaded)


@pytest.mark.parametrize("args, words", [
    # keys of the condition: the flags, which cross several values (issue 36's examples)
    ("pretrained=random:gpt2,intervention=zero", "give --intervention instead"),
    ("pretrained=random:llama,rope_scaling=yarn:2", "give --rope-scaling instead"),
    ("pretrained=random:gpt2,mask=linear", "give --mask instead"),
    ("pretrained=random:gpt2,mask_semantics=boolean", "give --mask-semantics instead"),
    ("pretrained=random:gpt2,protocol=study", "give --protocol instead"),
    ("intervention=zero,intervention=shuffle", "intervention is given twice"),
    ("pretrained=random:gpt2,pretrained=random:llama", "pretrained is given twice"),
    ("max_length=64,max_length=128", "max_length is given twice"),
    # seed, device, dtype, batch size: flags too (they were duplicate keyword arguments)
    ("device=cuda", "give --device instead"), ("dtype=float64", "give --dtype instead"),
    ("seed=1", "give --seed instead"), ("batch_size=abc", "give --batch_size instead"),
    # unknown or malformed
    ("foo=bar", "unknown key 'foo'"), ("garbage", "'garbage' is not KEY=VALUE"),
    ("=3", "'=3' is not KEY=VALUE"), ("max_lenght=128", "did you mean 'max_length'?"),
    ("pretrained=random:gpt2,revision=main", "unknown key 'revision'"),
    ("pretrained=random:gpt2,peft=x", "unknown key 'peft'"),
    # values of the wrong kind
    ("max_length=abc", "max_length=abc must be a positive integer"),
    ("max_length=0", "max_length=0 must be a positive integer"),
    ("max_length=1.5", "max_length=1.5 must be"), ("truncation=maybe", "truncation=maybe must be true or false"),
    ("softmax_dtype=float64", "softmax_dtype=float64 must be float32"),
    ("prefix_token_id=-1", "prefix_token_id=-1 must be a token id"),
    ("pretrained=", "pretrained= is empty"), ("pretrained=none", "pretrained= is empty"),
])
def test_model_args_follow_one_rule_before_anything_loads(invoke, never_loads, tmp_path, args, words):
    _one_line(invoke("lm-eval", "--model_args", args, "--tasks", "truthfulqa_mc1",
                     "--include_path", CONFIGS, "--out", str(tmp_path / "o")), words)
    assert not (tmp_path / "o").exists()


def test_hflm_keys_of_the_right_kind_pass_and_empty_items_are_skipped():
    from pecli.integrations.lm_eval import split_model_args

    own, hflm = split_model_args(",pretrained=random:gpt2,,max_length=128,truncation=true,")
    assert own == {"pretrained": "random:gpt2"} and hflm == {"max_length": 128, "truncation": True}


@pytest.mark.parametrize("kwargs, words", [
    ({"foo": "bar"}, "unknown key 'foo'"), ({"max_length": "abc"}, "max_length=abc must be"),
    ({"batch_size": "many"}, "batch_size=many must be a positive integer, auto or auto:N"),
    ({"pretrained": ""}, "pretrained= is empty"), ({"seed": "x"}, "seed"),
])
def test_the_lm_eval_model_checks_its_arguments_before_loading(never_loads, kwargs, words):
    from pecli.integrations.lm_eval import PecliLM

    with pytest.raises(ConfigError, match=words) as err:
        PecliLM(**{"pretrained": "random:gpt2", **kwargs})
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("metadata, words", [
    ('{"passkey_depths": [2]}', "passkey_depths"), ('{"passkey_depths": [-0.5]}', "passkey_depths"),
    ('{"passkey_trials": -1}', "passkey_trials: -1 is out of range"),
    ('{"passkey_trials": "five"}', "passkey_trials: 'five' is not an integer"),
    ('{"passkey_lengths": "abc"}', "passkey_lengths: 'abc' must be integers"),
    ('{"passkey_lengths": [1]}', "of at least 2 tokens"),
    ('{"passkey_lengths": [100000000]}', "past the longest prompt length pecli builds"),
    ('{"passkey_seed": -3}', "passkey_seed: -3 is out of range"),
    ('{"passkey_length": [64]}', "unknown key 'passkey_length'"),
])
def test_passkey_metadata_is_checked_as_pecli_passkey_checks_its_flags(invoke, never_loads, tmp_path,
                                                                      metadata, words):
    _one_line(invoke("lm-eval", "--model_args", "pretrained=random:llama", "--tasks", "passkey",
                     "--include_path", CONFIGS, "--metadata", metadata, "--out", str(tmp_path / "o")),
              words)


def test_the_passkey_task_itself_checks_its_metadata():
    import importlib.util

    spec = importlib.util.spec_from_file_location("pecli_data", f"{CONFIGS}/pecli_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(ConfigError, match="passkey_depths"):
        module.passkey(pretrained="random:llama", passkey_depths=[2])


def test_a_passkey_prompt_lm_eval_would_cut_is_refused(tiny):
    from pecli.integrations.lm_eval import check_passkey_fits, passkey_sizes

    gpt2, llama = tiny("gpt2"), tiny("llama")  # 64 positions each
    fits, past = passkey_sizes({"passkey_lengths": [48]}), passkey_sizes({"passkey_lengths": [60]})
    check_passkey_fits(gpt2, fits, {})
    with pytest.raises(ConfigError, match="not applicable: 64 learned positions"):
        check_passkey_fits(gpt2, past, {"max_length": 1000})  # a learned table has no row past 64
    with pytest.raises(ConfigError, match=r"\(70\) exceed max_length 64, .* give max_length=70"):
        check_passkey_fits(llama, past, {})  # rotary: lm-eval would keep only the last 64 tokens
    check_passkey_fits(llama, past, {"max_length": 70})  # asked for: scored past the context
    with pytest.raises(ConfigError, match="exceed max_length 50"):
        check_passkey_fits(llama, fits, {"max_length": 50})


@pytest.mark.parametrize("path, words", [("nowhere", "does not exist"), ("file.txt", "is a file")])
def test_an_include_path_that_is_no_folder_is_refused(invoke, never_loads, tmp_path, path, words):
    (tmp_path / "file.txt").write_text("x")
    _one_line(invoke("lm-eval", "--tasks", "mytask", "--include_path", str(tmp_path / path),
                     "--out", str(tmp_path / "o")), f"include_path (--include_path): {tmp_path / path} {words}")


def test_a_task_yaml_that_does_not_parse_is_named(invoke, never_loads, tmp_path):
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "mine.yaml").write_text("task: mine\n  dataset_path: [\n")
    _one_line(invoke("lm-eval", "--tasks", "mine", "--include_path", str(tmp_path / "tasks"),
                     "--out", str(tmp_path / "o")), "mine.yaml does not parse (")


def test_fixed_shots_are_said_and_recorded_as_lm_eval_used_them(invoke, tmp_path, monkeypatch):
    from pecli.integrations.lm_eval import task_rows

    def stop(*args, **kwargs):
        raise ConfigError("stopped before loading")

    monkeypatch.setattr("pecli.integrations.lm_eval.load", stop)
    with pytest.warns(UserWarning, match="truthfulqa_mc1 fixes num_fewshot 0 in its config: lm-eval "
                                         "ignores --num_fewshot 2 for it, and its rows say 0"):
        result = invoke("lm-eval", "--tasks", "truthfulqa_mc1", "--include_path", CONFIGS,
                        "--num_fewshot", "2", "--out", str(tmp_path / "o"))
    assert "stopped before loading" in result.output
    results = {"results": {"t": {"acc,none": 0.5}}, "n-shot": {"t": 0}, "n-samples": {"t": {"effective": 2}},
               "configs": {"t": {"num_fewshot": 0}}}
    rows = task_rows(results, {("t", "acc", "none"): {0: 1.0, 1: 0.0}}, {}, 0, 0)
    assert rows[0]["num_fewshot"] == 0


def test_a_task_lm_eval_cannot_build_is_one_line():
    from pecli.integrations.lm_eval import evaluate_or_say_why

    def offline(**kwargs):
        raise ConnectionError("Couldn't reach 'truthful_qa' on the Hub (LocalEntryNotFoundError)")

    with pytest.raises(ConfigError, match=r"lm-eval could not run truthfulqa_mc1: ConnectionError: "
                                          r"Couldn't reach .* \(offline: the task's dataset is not"):
        evaluate_or_say_why(offline, tasks_named=("truthfulqa_mc1",))
