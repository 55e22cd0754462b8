"""`pecli lm-eval` as a user runs it: one lm-eval run per condition, intact first, lm-eval's
JSON per condition, a tidy table with provenance, a figure; bad input in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

pytest.importorskip("lm_eval", reason="lm-eval not installed (make setup)")

from pecli.cli.app import app  # noqa: E402
from pecli.measures.intervals import paired_proportion_difference  # noqa: E402

runner = CliRunner()
CONFIGS = str(Path(__file__).resolve().parents[2] / "configs" / "lm_eval")


def test_two_conditions_write_lm_evals_json_a_table_and_a_figure(tmp_path, shared_data):
    out = tmp_path / "run"
    result = runner.invoke(app, [
        "lm-eval", "models/tiny-gpt2-imdb", "--intervention", "zero",  # the model as every command names it
        "--tasks", "truthfulqa_mc1,truthfulqa_mc2", "--include_path", CONFIGS, "--limit", "4",
        "--device", "cpu", "--bootstrap", "200", "--out", str(out), "--log_samples",
        "--data-dir", str(shared_data)])
    assert result.exit_code == 0, result.output
    df = pd.read_csv(out / "lm_eval.csv")
    assert list(dict.fromkeys(df["intervention"])) == ["intact", "zero"]  # intact first
    assert "default/legacy" not in result.output  # the summary names conditions by their label
    assert set(df["task"]) == {"truthfulqa_mc1", "truthfulqa_mc2"} and (df["rows"] == 4).all()
    assert df[["model_revision", "lm_eval_version", "task_version", "tokens"]].notna().all().all()
    assert (df["ci_low"] <= df["value"]).all() and (df["value"] <= df["ci_high"]).all()
    for condition in ("intact-default-legacy", "zero-default-legacy"):
        (results,) = (out / "lm_eval" / condition).rglob("results_*.json")
        saved = json.loads(results.read_text())
        row = df[(df["intervention"] == condition.split("-")[0]) & (df["task"] == "truthfulqa_mc2")]
        assert saved["results"]["truthfulqa_mc2"]["acc,none"] == pytest.approx(row["value"].item())
        assert f"intervention={condition.split('-')[0]}" in saved["config"]["model_args"]
    # each condition minus intact on the same documents, from lm-eval's own logged samples
    accs = {}
    for condition in ("intact", "zero"):
        for task in ("truthfulqa_mc1", "truthfulqa_mc2"):
            (path,) = (out / "lm_eval" / f"{condition}-default-legacy").rglob(f"samples_{task}_*.jsonl")
            lines = [json.loads(line) for line in path.read_text().splitlines()]
            accs[condition, task] = {s["doc_id"]: s["acc"] for s in lines}
    for task in ("truthfulqa_mc1", "truthfulqa_mc2"):
        by_hand = sum(accs["zero", task][d] - accs["intact", task][d] for d in range(4)) / 4
        rows = df[df["task"] == task].set_index("intervention")
        assert rows.loc["zero", "diff_vs_intact"] == pytest.approx(by_hand, abs=1e-12)
        assert rows.loc["intact", ["diff_vs_intact", "diff_ci_low"]].isna().all()
        same = len({accs["zero", task][d] - accs["intact", task][d] for d in range(4)}) == 1
        if task == "truthfulqa_mc1":  # each document right or wrong: Newcombe's paired interval
            assert tuple(rows.loc["zero", ["diff_vs_intact", "diff_ci_low", "diff_ci_high"]]) == pytest.approx(
                paired_proportion_difference([accs["zero", task][d] for d in range(4)],
                                             [accs["intact", task][d] for d in range(4)]))
        elif same:  # every document moved alike: no bootstrap interval (issue 46), never [x, x]
            assert rows.loc["zero", ["diff_ci_low", "diff_ci_high"]].isna().all()
        else:
            assert rows.loc["zero", "diff_ci_low"] < rows.loc["zero", "diff_ci_high"]
    assert "minus intact" in result.output
    assert (out / "figures" / "lm_eval.png").stat().st_size > 0
    # chance of MC1's accuracy: 1 / (number of choices), averaged over the documents lm-eval logged
    (path,) = (out / "lm_eval" / "intact-default-legacy").rglob("samples_truthfulqa_mc1_*.jsonl")
    docs = [json.loads(line)["doc"] for line in path.read_text().splitlines()]
    by_hand = sum(1 / len(d["mc1_targets"]["choices"]) for d in docs) / len(docs)
    chance = df.loc[(df["task"] == "truthfulqa_mc1") & (df["metric"] == "acc"), "chance"].tolist()
    assert chance == pytest.approx([by_hand] * 2)
    assert df.loc[df["task"] == "truthfulqa_mc2", "chance"].isna().all()  # its own scoring
    compared = runner.invoke(app, ["compare", str(out), "--out", str(tmp_path / "cmp")])
    assert compared.exit_code == 0, compared.output
    table = pd.read_csv(tmp_path / "cmp" / "compare.csv")
    assert set(table["metric"]) == {"truthfulqa_mc1_acc", "truthfulqa_mc2_acc"} and len(table) == 4
    # with a length and a passkey run (the committed ones): every folder used, every interval
    # labelled with the method its own rows record
    offline = Path(__file__).resolve().parents[2] / "results" / "offline"
    together = runner.invoke(app, ["compare", str(out), str(offline / "length-smollm2"),
                                   str(offline / "passkey-smollm2"), "--out", str(tmp_path / "cmp3")])
    assert together.exit_code == 0, together.output
    table = pd.read_csv(tmp_path / "cmp3" / "compare.csv")
    assert set(table["metric"]) == {"truthfulqa_mc1_acc", "truthfulqa_mc2_acc", "length_perplexity",
                                    "passkey_accuracy"}
    lm = table[table["metric"].str.startswith("truthfulqa")].set_index(["metric", "condition"])
    for _, row in df.iterrows():
        got = lm.loc[(f"{row['task']}_{row['metric']}", row["intervention"])]
        assert got["interval"] == row["interval_method"] and got["value"] == row["value"]
    assert (table.loc[table["metric"] == "passkey_accuracy", "interval"]
            == "95 % Wilson score interval over trials").all()


@pytest.mark.parametrize("args,words", [
    (["--tasks", "nosuch_task"], "unknown lm-eval task"),
    ([], "name at least one lm-eval task"),
    (["--tasks", "truthfulqa_mc1", "--model_args", "pretrained=random:gpt2,intervention=zero",
      "--intervention", "shuffle"], "give --intervention instead"),
    (["--tasks", "truthfulqa_mc1", "--protocol", "study"], "relative"),
    (["random:gpt2", "--tasks", "truthfulqa_mc1", "--model_args", "pretrained=random:llama"],
     "the model is given twice"),
    (["--tasks", "truthfulqa_mc1", "--model_args", "pretrained=random:bert"], "encoder"),
    (["--tasks", "truthfulqa_mc1", "--predict_only"], "predict_only skips"),
    (["--tasks", "truthfulqa_mc1", "--fewshot_as_multiturn"], "add --apply_chat_template"),
    (["--tasks", "truthfulqa_mc1", "--seed", "1,2"], "four comma-separated seeds"),
    (["--tasks", "truthfulqa_mc1", "--seed", "-3"], "not a seed"),
    (["--tasks", "passkey", "--gen_kwargs", "temperature"], "gen_kwargs"),
    # issue 46 §3: the tokenizer alone says there is no chat template (gemma3: a GGUF alias's
    # cached tokenizer, no weights read)
    *[([model, "--tasks", "truthfulqa_mc1", "--apply_chat_template"], "has no chat template")
      for model in ("random:gpt2", str(Path(__file__).resolve().parents[2] / "models" / "tiny-gpt2-imdb"),
                    "gemma3")],
])
def test_bad_input_is_one_line(tmp_path, monkeypatch, args, words):
    def never(*a, **k):
        raise AssertionError("loaded before the options were checked")

    monkeypatch.setattr("pecli.models.loading.load_model", never)
    result = runner.invoke(app, ["lm-eval", "--include_path", CONFIGS, *args,
                                 "--out", str(tmp_path / "o")])
    assert result.exit_code == 1 and not isinstance(result.exception, AssertionError), result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and words in lines[0], result.output


def _chat_model(tmp_path: Path) -> Path:
    """The committed tiny GPT-2 with a chat template (a ChatML one, as SmolLM2's)."""
    import shutil

    root = Path(__file__).resolve().parents[2]
    model = tmp_path / "chat-gpt2"
    shutil.copytree(root / "models" / "tiny-gpt2-imdb", model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["chat_template"] = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                               "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>"
                               "assistant\n{% endif %}")
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    return model


def _requests(arguments) -> list[tuple]:
    """A sample's requests as (context, continuation): logged JSONL and in-memory alike."""
    if isinstance(arguments, dict):
        return [tuple(arguments[f"gen_args_{i}"].values()) for i in range(len(arguments))]
    return [tuple(a) for a in arguments]


def test_chat_template_system_instruction_and_seeds_act_as_in_lm_eval(tmp_path, shared_data, monkeypatch,
                                                                       capfd):
    """--apply_chat_template --system_instruction --log_samples --seed: the prompts pecli's
    run sent are those lm-eval's own HFLM builds with the same options (every document's
    request, literally), the template's hash and the seeds are in every row, and nothing
    from git reaches stderr outside a checkout."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    model = _chat_model(tmp_path)
    monkeypatch.chdir(tmp_path)  # not a git checkout
    out = tmp_path / "run"
    result = runner.invoke(app, [
        "lm-eval", "--model_args", f"pretrained={model}", "--tasks", "truthfulqa_mc1",
        "--include_path", CONFIGS, "--limit", "3", "--device", "cpu", "--bootstrap", "0",
        "--apply_chat_template", "--system_instruction", "Answer truthfully.", "--log_samples",
        "--seed", "7", "--out", str(out), "--data-dir", str(shared_data)])
    assert result.exit_code == 0, result.output
    assert "not a git repository" not in capfd.readouterr().err  # git writes to fd 2 itself
    df = pd.read_csv(out / "lm_eval.csv")
    template = json.loads((model / "tokenizer_config.json").read_text())["chat_template"]
    import hashlib

    assert (df["chat_template_sha256"] == hashlib.sha256(template.encode()).hexdigest()[:16]).all()
    assert df["apply_chat_template"].all() and df["fewshot_as_multiturn"].all()
    assert (df["system_instruction"] == "Answer truthfully.").all() and (df["lm_eval_seed"] == "7,7,7,7").all()
    (path,) = (out / "lm_eval").rglob("samples_truthfulqa_mc1_*.jsonl")
    ours = [_requests(json.loads(line)["arguments"]) for line in path.read_text().splitlines()]
    assert ours[0][0][0].startswith("<|im_start|>system\nAnswer truthfully.<|im_end|>\n<|im_start|>user\nQ:")
    monkeypatch.setenv("PECLI_DATA_DIR", str(shared_data))
    theirs = lm_eval.simple_evaluate(
        model=HFLM(pretrained=str(model), device="cpu"), tasks=["truthfulqa_mc1"], limit=3,
        task_manager=TaskManager(include_path=CONFIGS), apply_chat_template=True,
        fewshot_as_multiturn=True, system_instruction="Answer truthfully.", log_samples=True,
        bootstrap_iters=0)
    assert [_requests(s["arguments"]) for s in theirs["samples"]["truthfulqa_mc1"]] == ours
    assert "not a git repository" in capfd.readouterr().err  # lm-eval's own run, for contrast
    plain = Path(__file__).resolve().parents[2] / "models" / "tiny-gpt2-imdb"
    refused = runner.invoke(app, ["lm-eval", "--model_args", f"pretrained={plain}",
                                  "--tasks", "truthfulqa_mc1", "--include_path", CONFIGS, "--limit", "2",
                                  "--device", "cpu", "--apply_chat_template", "--out", str(tmp_path / "r"),
                                  "--data-dir", str(shared_data)])
    lines = [line for line in refused.output.splitlines() if line.strip()]
    assert refused.exit_code == 1 and lines == [lines[0]] and "has no chat template" in lines[0], refused.output



QUESTIONS = """\
# pecli perplexity's text as an lm-eval task: each text scored whole after the model's start
# token (lm-eval's loglikelihood_rolling prefix token), from the same JSONL file
task: questions
dataset_path: json
dataset_kwargs:
  data_files: {validation: "%s"}
output_type: loglikelihood_rolling
validation_split: validation
doc_to_text: ""
doc_to_target: "{{text}}"
metric_list:
  - metric: word_perplexity
metadata:
  version: 1.0
"""


def test_a_fitted_mask_file_gives_lm_eval_the_perplexity_pecli_perplexity_gives(tmp_path, shared_data):
    """`pecli lm-eval --intervention zero --mask FILE` (a file of `pecli mask fit`: the
    committed tiny GPT-2 one) scores texts as `pecli perplexity --mask FILE` does: lm-eval's
    logged log-likelihood of each of 12 TruthfulQA questions gives, over pecli's token counts,
    pecli's per-text and corpus perplexities; both runs' rows name the file with its hash."""
    import math

    root = Path(__file__).resolve().parents[2]
    mask = root / "results" / "offline" / "mask-fit-tiny-gpt2" / "mask" / "mask.json"
    items = json.loads((shared_data / "truthfulqa" / "mc_task.json").read_text(encoding="utf-8"))
    data = tmp_path / "questions.jsonl"
    data.write_text("".join(json.dumps({"text": it["question"]}) + "\n" for it in items[:12]))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "questions.yaml").write_text(QUESTIONS % data.as_posix())
    common = ["--intervention", "zero", "--mask", str(mask), "--mask-semantics", "log-bias",
              "--device", "cpu", "--bootstrap", "0"]
    ppl = runner.invoke(app, ["perplexity", "models/tiny-gpt2-imdb", "--dataset", str(data), *common,
                              "--out", str(tmp_path / "ppl")])
    assert ppl.exit_code == 0, ppl.output
    texts = pd.read_csv(tmp_path / "ppl" / "texts.csv")
    texts = texts[texts["intervention"] == "zero"]
    name = texts["mask"].iloc[0]
    assert name.startswith("file:") and "#sha256:" in name and len(texts) == 12
    corpus = pd.read_csv(tmp_path / "ppl" / "perplexity.csv")
    corpus = corpus[(corpus["intervention"] == "zero") & (corpus["aggregation"] == "corpus")]
    assert corpus["truncated"].item() == 0  # every question whole: one lm-eval window each

    out = tmp_path / "lm"
    lm = runner.invoke(app, ["lm-eval", "--model_args", "pretrained=models/tiny-gpt2-imdb",
                             "--tasks", "questions", "--include_path", str(tasks), "--log_samples",
                             *common, "--out", str(out)])
    assert lm.exit_code == 0, lm.output
    df = pd.read_csv(out / "lm_eval.csv")
    masked = df[df["intervention"] == "zero"]
    assert len(masked) and (masked["mask"] == name).all() and (masked["mask_semantics"] == "log-bias").all()
    (path,) = [p for p in (out / "lm_eval").rglob("samples_questions_*.jsonl")
               if p.relative_to(out / "lm_eval").parts[0].startswith("zero-")]
    ll = {}
    for line in path.read_text().splitlines():
        sample = json.loads(line)
        value = sample["filtered_resps"][0]
        ll[sample["doc_id"]] = float(value[0] if isinstance(value, list) else value)
    assert sorted(ll) == sorted(texts["text_id"])
    for _, row in texts.iterrows():  # each text: exp(-log-likelihood / its tokens)
        ours = math.exp(-ll[int(row["text_id"])] / row["text_tokens"])
        assert ours == pytest.approx(row["value"], rel=1e-5), row["text_id"]
    total = sum(ll.values())
    assert math.exp(-total / texts["text_tokens"].sum()) == pytest.approx(corpus["value"].item(), rel=1e-5)
    # the mask acted: lm-eval's intact run of the same texts gives another number
    (path,) = [p for p in (out / "lm_eval").rglob("samples_questions_*.jsonl")
               if p.relative_to(out / "lm_eval").parts[0].startswith("intact-")]
    intact = sum(float(v[0] if isinstance(v := json.loads(line)["filtered_resps"][0], list) else v)
                 for line in path.read_text().splitlines())
    assert abs(intact - total) > 1e-3 * abs(total)
