"""The lm-eval model `pecli`: registered on import, options checked before loading, the
condition active for every request type and undone by close(), task YAMLs equal to lm-eval's."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch

lm_eval = pytest.importorskip("lm_eval", reason="lm-eval not installed (make setup)")

from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.models.huggingface import HFLM  # noqa: E402

from pecli.integrations import lm_eval as plugin  # noqa: E402
from pecli.runs.errors import ConfigError, InterventionError, ModelError  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "lm_eval"
TEXT = "The film was long, but the last hour moved me more than anything this year."


@pytest.fixture(scope="module")
def loaded():
    from pecli.models.loading import load_model

    return load_model("models/tiny-gpt2-imdb", device="cpu")


def _requests(kind: str, n: int = 2):
    args = {"loglikelihood": ("The film was", " long"),
            "loglikelihood_rolling": (TEXT,),
            "generate_until": ("The film was", {"until": ["\n"], "max_gen_toks": 6,
                                                "do_sample": False})}[kind]
    return [Instance(kind, {}, args, i) for i in range(n)]


def _answer(lm, kind: str):
    return getattr(lm, kind)(_requests(kind), disable_tqdm=True)


def test_the_model_is_registered_as_pecli():
    from lm_eval.api.registry import get_model

    assert get_model("pecli") is plugin.PecliLM


@pytest.mark.parametrize("args,error,words", [
    ({"intervention": "nosuch"}, InterventionError, "unknown intervention"),
    ({"intervention": "zero,shuffle"}, ConfigError, "one value per model"),
    ({"mask": "linaer"}, ConfigError, "mask"),
    ({"protocol": "study"}, ConfigError, "relative"),
    ({"device": "cdua"}, ConfigError, "device"),
    ({"pretrained": "random:bert"}, ModelError, "encoder"),
    ({"pretrained": "random:bloom", "mask": "linear"}, ModelError, "masks do not apply"),
    ({"pretrained": "random:llama", "intervention": "swap:random:bert"}, InterventionError, "swap"),
])
def test_bad_model_args_fail_in_one_line_before_loading(monkeypatch, args, error, words):
    def never(*a, **k):
        raise AssertionError("loaded before the model_args were checked")

    monkeypatch.setattr("pecli.models.loading.load_model", never)
    with pytest.raises(error, match=words) as caught:
        plugin.PecliLM(**{"pretrained": "random:gpt2", **args})
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("kind", ["loglikelihood", "loglikelihood_rolling", "generate_until"])
def test_the_condition_reaches_every_request_type_and_close_undoes_it(loaded, kind):
    """Each answer under `zero` equals lm-eval's own HFLM on the model inside pecli's
    intervention, and the intact one equals HFLM on the untouched model."""
    from pecli.positions.interventions import intervene

    before = {k: v.clone() for k, v in loaded.model.state_dict().items()}
    plain = HFLM(pretrained=loaded.model, tokenizer=loaded.tokenizer, batch_size=2)
    intact = _answer(plain, kind)
    with torch.inference_mode(), intervene(loaded, "zero"):
        expected = _answer(plain, kind)
    lm = plugin.PecliLM(pretrained="models/tiny-gpt2-imdb", intervention="zero", loaded=loaded,
                        batch_size=2)
    try:
        got = _answer(lm, kind)
        assert lm.tokens > 0
    finally:
        lm.close()
    assert got == expected
    if kind != "generate_until":  # a tiny model may generate the same words either way
        assert got != intact
    assert _answer(plain, kind) == intact  # close() put the model back
    for key, value in loaded.model.state_dict().items():
        assert torch.equal(before[key], value), key


def test_a_mask_reaches_loglikelihood(loaded):
    from pecli.measures.lm_scoring import installed, plan

    plain = HFLM(pretrained=loaded.model, tokenizer=loaded.tokenizer, batch_size=2)
    intact = _answer(plain, "loglikelihood")
    with torch.inference_mode(), installed(loaded, plan("linear", "log-bias", "relative")):
        expected = _answer(plain, "loglikelihood")
    lm = plugin.PecliLM(pretrained="models/tiny-gpt2-imdb", mask="linear",
                        mask_semantics="log-bias", loaded=loaded, batch_size=2)
    try:
        assert _answer(lm, "loglikelihood") == expected != intact
    finally:
        lm.close()
    assert _answer(plain, "loglikelihood") == intact


def test_conditions_put_the_intact_model_first_and_cross_rope_scaling():
    from pecli.experiments.options.lm_eval import LmEvalOptions

    options = LmEvalOptions.build({"model": "random:llama", "tasks": "t",
                                   "intervention": ["zero"], "rope_scaling": "yarn:2"}, "test")
    grid = plugin.conditions(options)
    assert [(c["intervention"], c["rope_scaling"]) for c in grid] == [
        ("intact", None), ("intact", "yarn:2"), ("zero", None), ("zero", "yarn:2")]
    assert plugin.condition_dir(grid[-1]) == "zero-default-legacy-yarn_2"


@pytest.mark.parametrize("task", ["truthfulqa_mc1", "truthfulqa_mc2"])
def test_local_tasks_are_lm_evals_own_but_for_the_dataset(task, shared_data, monkeypatch):
    """Every field of configs/lm_eval's task but where the data comes from equals the
    installed lm-eval's, and the first documents' prompts and choices are the same."""
    import lm_eval.tasks as tasks_pkg
    from lm_eval.tasks import TaskManager
    from lm_eval.tasks._yaml_loader import load_yaml

    monkeypatch.setenv("PECLI_DATA_DIR", str(shared_data))
    own = Path(tasks_pkg.__file__).parent / "truthfulqa" / f"{task}.yaml"
    theirs, ours = load_yaml(own), load_yaml(CONFIGS / f"{task}.yaml")
    data_keys = {"dataset_path", "dataset_name", "custom_dataset", "process_results"}
    assert {k: v for k, v in ours.items() if k not in data_keys} == \
        {k: v for k, v in theirs.items() if k not in data_keys}
    assert "dataset_path" not in ours and callable(ours["custom_dataset"])
    if "process_results" in theirs:  # lm-eval's own function (mc2 v3.0), imported
        assert inspect.getsource(ours["process_results"]) == \
            inspect.getsource(theirs["process_results"])
    task_obj = TaskManager(include_path=str(CONFIGS)).load_task_or_group([task])[task]
    docs = task_obj.validation_docs()
    assert len(docs) == 817
    doc = docs[0]
    assert task_obj.doc_to_text(doc).endswith("\n\nQ: " + doc["question"] + "\nA:")
    targets = doc["mc1_targets"] if task == "truthfulqa_mc1" else doc["mc2_targets"]
    assert task_obj.doc_to_choice(doc) == targets["choices"] and targets["labels"][0] == 1


USER_TASK = """task: my_reviews
dataset_path: json
dataset_kwargs:
  data_files:
    test: {path}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
  - metric: bits_per_byte
"""


def test_simple_evaluate_runs_a_task_yaml_a_user_wrote(tmp_path):
    """model="pecli" by name on the user's own loglikelihood_rolling task: the condition
    moves lm-eval's perplexity, and the intact run equals lm-eval's HFLM on the same model."""
    import json

    from lm_eval.tasks import TaskManager

    data = tmp_path / "reviews.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in
                            [TEXT, "A quiet film about a family, told with patience and care.",
                             "I left after twenty minutes; the sound was bad and the plot worse."]))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "my_reviews.yaml").write_text(USER_TASK.format(path=data))

    def ppl(args: str) -> float:
        out = lm_eval.simple_evaluate(model="pecli", model_args=args, tasks=["my_reviews"],
                                      task_manager=TaskManager(include_path=str(tasks)))
        return out["results"]["my_reviews"]["word_perplexity,none"]

    base = "pretrained=models/tiny-gpt2-imdb,device=cpu"
    intact, zero = ppl(base), ppl(base + ",intervention=zero")
    from pecli.models.loading import load_model

    loaded = load_model("models/tiny-gpt2-imdb", device="cpu")
    plain = lm_eval.simple_evaluate(
        model=HFLM(pretrained=loaded.model, tokenizer=loaded.tokenizer), tasks=["my_reviews"],
        task_manager=TaskManager(include_path=str(tasks)))["results"]["my_reviews"]
    assert intact == pytest.approx(plain["word_perplexity,none"], rel=1e-6)
    assert zero != pytest.approx(intact, rel=1e-4) and zero > 1


def test_the_passkey_task_is_pecli_passkeys_trials_scored_by_its_rule(loaded):
    """configs/lm_eval/passkey.yaml: the documents are the prompts and keys `pecli passkey`
    builds for the model's tokenizer; each answer is scored by pecli's decoding rule."""
    from lm_eval.tasks import TaskManager

    from pecli.measures.passkey import answer, fit, keys

    meta = {"pretrained": "models/tiny-gpt2-imdb", "passkey_lengths": [100],
            "passkey_depths": [0.0, 1.0], "passkey_trials": 2}
    manager = TaskManager(include_path=str(CONFIGS), metadata=meta)
    docs = list(manager.load_task_or_group(["passkey"])["passkey"].test_docs())
    expected = [fit(loaded.tokenizer, k, 100, d) for d in (0.0, 1.0) for k in keys(0, 100, d, 2)]
    assert [(doc["prompt"], doc["k"], doc["tokens"]) for doc in docs] == \
        [(t.text, t.k, len(t.ids)) for t in expected]
    lm = plugin.PecliLM(pretrained="models/tiny-gpt2-imdb", loaded=loaded, batch_size=4)
    try:
        out = lm_eval.simple_evaluate(model=lm, tasks=["passkey"], task_manager=manager)
    finally:
        lm.close()
    rule = [float(answer(s["resps"][0][0]) == s["doc"]["k"]) for s in out["samples"]["passkey"]]
    assert [s["acc"] for s in out["samples"]["passkey"]] == rule
    assert out["results"]["passkey"]["acc,none"] == pytest.approx(sum(rule) / len(rule))


def test_mc2_v2_and_v3_differ_exactly_where_labels_are_not_sorted(shared_data):
    """pecli mc scores MC2 by v2.0 (the true choices before the first false); lm-eval 0.4.13's
    truthfulqa_mc2 by v3.0 (every true choice). On all 817 shipped items with seeded random
    log-likelihoods: pecli equals v2.0 by hand, lm-eval's own process_results_mc2 equals v3.0
    by hand, and the two differ on exactly the items whose labels are not sorted."""
    import numpy as np
    from lm_eval.tasks.truthfulqa.utils import process_results_mc2

    from pecli.data import items as item_files
    from pecli.measures import mc_scoring as mc

    items, _ = item_files.load_items("truthfulqa-mc", str(shared_data))
    rng = np.random.default_rng(0)
    unsorted, differ = set(), set()
    for item in items:
        choices, labels = item.targets["mc2"]
        ll = dict(zip(item.choices, rng.normal(-20, 3, len(item.choices)), strict=True))
        mc2_ll = np.array([ll[c] for c in choices])
        p = np.exp(mc2_ll) / np.exp(mc2_ll).sum()
        first_false = list(labels).index(0) if 0 in labels else len(labels)
        ours = mc.item_scores(item, np.array([ll[c] for c in item.choices]))["values"]["mc2"]
        theirs = process_results_mc2({"mc2_targets": {"labels": list(labels)}},
                                     [(v, False) for v in mc2_ll])["acc"]
        assert ours == pytest.approx(p[:first_false].sum(), abs=1e-12)
        assert theirs == pytest.approx(p[np.array(labels) == 1].sum(), abs=1e-12)
        if list(labels) != sorted(labels, reverse=True):
            unsorted.add(item.text_id)
        if abs(ours - theirs) > 1e-12:
            differ.add(item.text_id)
    assert differ == unsorted and len(unsorted) == 2  # the README's "2 of the 817 items"


def test_the_difference_from_intact_resamples_each_documents_pair_together():
    """A condition that lowers every document by exactly 0.25: the paired difference is -0.25
    on every resample (pairs resampled together), however spread the documents are, so it has
    no interval (a zero-width one says nothing, issue 46);
    documents missing from either side give NaN, never a difference of other documents."""
    import numpy as np
    import pandas as pd

    values = np.random.default_rng(0).uniform(0, 1, 30)
    intact = {("t", "acc", "none"): dict(enumerate(values))}
    lower = {("t", "acc", "none"): {i: v - 0.25 for i, v in enumerate(values)}}
    df = pd.DataFrame([{"task": "t", "metric": "acc", "filter": "none", "rows": 30,
                        "condition_index": i} for i in range(3)])
    missing = {("t", "acc", "none"): {i: v for i, v in enumerate(values) if i != 7}}
    from pecli.measures import intervals

    out = intervals.paired_with_intact(df, [intact, lower, missing], n_boot=1000, seed=0)
    assert np.isnan(out.loc[0, ["diff_vs_intact", "diff_ci_low", "diff_ci_high"]].astype(float)).all()
    assert out.loc[1, "diff_vs_intact"] == pytest.approx(-0.25, abs=1e-12)
    assert np.isnan(out.loc[1, ["diff_ci_low", "diff_ci_high"]].astype(float)).all()
    assert np.isnan(out.loc[2, "diff_vs_intact"])
