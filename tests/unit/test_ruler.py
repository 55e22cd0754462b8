"""pecli ruler: RULER's templates literally, seeded samples, no answer in its haystack, RULER's
scoring (lm-eval's own string_match_all), intervals, refusals, and a run twice."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from pecli.experiments.ruler import RulerOptions, essay, run
from pecli.measures import ruler as R
from pecli.runs.errors import ConfigError

SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]


def made_up():
    """A haystack of 400 sentences of made-up words, and 200 qa items of made-up questions and
    answers (no data directory needed)."""
    from dataclasses import replace

    words = ["".join(p) for p in itertools.product(SYLLABLES[:40], SYLLABLES[:40])][:1600]
    rng = np.random.default_rng(0)
    text = " ".join(" ".join(rng.choice(words, 9)).capitalize() + "." for _ in range(400))
    questions = [" ".join(rng.choice(words, 6)).capitalize() + "?" for _ in range(200)]
    answers = [[" ".join(rng.choice(words, n)) for n in (2, 4, 5)] for _ in range(200)]
    return replace(R.haystack_of([text], "made-up"), qa=R.qa_items(questions, answers))


@pytest.fixture(scope="module")
def hay():
    return made_up()


@pytest.fixture(scope="module")
def tok():
    from conftest import make_tiny

    return make_tiny("llama").tokenizer


@pytest.mark.parametrize("task", list(R.TASKS))
def test_samples_are_seeded_and_fit_the_length(tok, hay, task):
    length = max(R.TASKS[task].min_length, 1024 if task == "cwe" else 512)
    a, b = (R.fit(tok, task, 0, length, 3, hay) for _ in range(2))
    assert a == b  # the same seed: the same sample
    assert a != R.fit(tok, task, 0, length, 4, hay) and a != R.fit(tok, task, 1, length, 3, hay)
    assert len(a.ids) + R.TASKS[task].new_tokens <= length  # RULER's sizing
    bigger = R.draw(task, 0, length, 3, a.attempt, hay, a.size + 1)
    assert len(tok(bigger.text)["input_ids"]) + R.TASKS[task].new_tokens > length  # the most that fits
    assert not any(R.found_in(x, R.draw(task, 0, length, 3, a.attempt, hay, a.size).rest) for x in a.answers)


def test_niah_is_rulers_template_literally(tok, hay):
    s = R.fit(tok, "niah_single_1", 0, 512, 0, hay)
    value, = s.answers
    head = ("A special magic number is hidden within the following text. Make sure to memorize it. "
            "I will quiz you about the number afterwards.\n")
    assert s.text.startswith(head) and len(value) == 7 and value.isdigit()
    key = s.text.split("What is the special magic number for ")[1].split(" mentioned")[0]
    assert s.text.endswith(f"What is the special magic number for {key} mentioned in the provided "
                           f"text? The special magic number for {key} mentioned in the provided text is")
    body = s.text[len(head):].split("\nWhat is")[0].split("\n")
    needle = f"One of the special magic numbers for {key} is: {value}."
    assert body.count(needle) == 1 and set(body) == {R.NOISE, needle}
    assert body.index(needle) == round(s.depth * s.size)  # the depth recorded is where it sits


def test_multikey_has_three_distractor_keys_and_multiquery_asks_four(tok, hay):
    s = R.fit(tok, "niah_multikey_1", 0, 1024, 0, hay)
    assert s.text.count("One of the special magic numbers for ") == 4 and len(s.answers) == 1
    q = R.fit(tok, "niah_multiquery", 0, 1024, 0, hay)
    assert len(q.answers) == 4 and "What are all the special magic numbers for " in q.text
    assert ", and " in q.text.split("What are all")[1]
    v = R.fit(tok, "niah_multivalue", 0, 1024, 0, hay)
    assert len(v.answers) == 4 and all(f"is: {a}." in v.text for a in v.answers)


def test_vt_answers_are_the_queried_chain_and_the_distractor_chain_is_there(tok, hay):
    s = R.fit(tok, "vt", 0, 512, 1, hay)
    value = s.text.split("assigned the value ")[1].split(" ")[0]
    first, *rest = s.answers
    assert f"VAR {first} = {value}" in s.text and len(s.answers) == 5
    for a, b in zip(s.answers, s.answers[1:], strict=False):
        assert f"VAR {b} = VAR {a} " in s.text
    assert s.text.count(" = VAR ") == 8  # two chains of four hops


def test_cwe_and_fwe_answers_are_the_most_frequent(tok, hay):
    import re

    s = R.fit(tok, "cwe", 0, 1024, 0, hay)
    listed = s.text.rsplit("Memorize the ones that appear most often.\n", 1)[1].split("\nQuestion")[0]
    counts = {w: len(re.findall(rf"\d+\. {w}(?= |$)", listed)) for w in set(re.findall(r"\d+\. (\S+)", listed))}
    assert sorted(s.answers) == sorted(sorted(counts, key=counts.get)[-10:])
    assert min(counts[a] for a in s.answers) > max(c for w, c in counts.items() if w not in s.answers)
    f = R.fit(tok, "fwe", 0, 1024, 0, hay)
    words = f.text.split("coded words. ")[1].split("\nQuestion")[0].split()
    top = [w for w, _ in __import__("collections").Counter(words).most_common(4)]
    assert top[0] == "..." and top[1:] == list(f.answers)


def test_an_answer_in_the_haystack_draws_again_or_refuses(tok, hay, monkeypatch):
    real = R.draw

    def planted(task, seed, length, index, attempt, hay_, size):
        d = real(task, seed, length, index, attempt, hay_, size)
        return d if attempt >= 2 else R.Drawn(d.text, d.answers, d.rest + " " + d.answers[0])

    monkeypatch.setattr(R, "draw", planted)
    assert R.fit(tok, "niah_single_2", 0, 512, 0, hay).attempt == 2
    monkeypatch.setattr(R, "ATTEMPTS", 2)
    with pytest.raises(ValueError, match="an answer occurs in the haystack"):
        R.fit(tok, "niah_single_2", 0, 512, 0, hay)


def test_qa_is_rulers_template_with_one_gold_document_among_other_items(tok, hay):
    s = R.fit(tok, "qa", 0, 1024, 2, hay)
    head = ("Answer the question based on the given documents. Only give me the answer and do not "
            "output any other words.\n\nThe following are given documents.\n\n")
    question = s.text.rsplit("\n\nQuestion: ", 1)[1].removesuffix(" Answer:")
    assert s.text.startswith(head + "Document 1:\n") and s.text.endswith(" Answer:")
    gold, = (item for item in hay.qa if item.question == question)
    assert s.answers == gold.answers and s.answers
    body = s.text[len(head):].split("\n\nAnswer the question based")[0].split("\n\n")
    assert [d.split(":\n")[0] for d in body] == [f"Document {i + 1}" for i in range(len(body))]
    docs = [d.split(":\n", 1)[1] for d in body]
    assert docs.count(gold.document) == 1 and len(set(docs)) == len(docs) == s.size + 1
    assert set(docs) <= {item.document for item in hay.qa}  # the distractors: other items
    assert docs.index(gold.document) == round(s.depth * s.size)
    others = [d for d in docs if d != gold.document]
    assert not any(a.lower() in d.lower() for a in s.answers for d in [question, *others])


def test_qa_on_truthfulqa_asks_most_items_and_never_finds_an_answer_among_distractors(tok, shared_data):
    from pecli.data.datasets import load_data

    frame = load_data("truthfulqa", data_dir_=shared_data).frame
    items = R.qa_items(list(frame["question"]), list(frame["correct_answers"]))
    assert len(items) == 817 and sum(bool(i.answers) for i in items) > 700
    hay = R.Haystack("truthfulqa", (), (), items)
    for i in range(3):
        s = R.fit(tok, "qa", 0, 2048, i, hay)
        others = s.text.split("Document ")[1:]
        holding = [d for d in others if any(a.lower() in d.lower() for a in s.answers)]
        assert len(holding) == 1 and s.size > 10  # the gold document alone, among many


def test_qa_items_ask_only_answers_of_their_own():
    items = R.qa_items(["Where is the red door?", "Who built it?"],
                       [["No", "the red door", "It is far away", "behind the old mill"],
                        ["It is far away", "Nobody built the thing"]])
    assert items[0].answers == ("behind the old mill",)  # short, in the question, in another's
    assert items[1].answers == ("Nobody built the thing",)
    assert items[0].document == "No. the red door. It is far away. behind the old mill."


def test_qa_score_is_rulers_string_match_part_literally():
    def string_match_part(preds, refs):  # RULER's eval/synthetic/constants.py, as written there
        return sum(max(1.0 if r.lower() in pred.lower() else 0.0 for r in ref)
                   for pred, ref in zip(preds, refs, strict=True)) / len(preds)

    cases = [("It is behind the Old Mill.", ("behind the old mill", "next to it")),
             ("nothing", ("a b c",)), ("a b c and d e f", ("a b c", "d e f"))]
    for out, answers in cases:
        assert R.score(out, answers, "part") == string_match_part([out], [list(answers)])
    assert R.score("a b c", ("a b c", "d e f"), "part") == 1.0 != R.score("a b c", ("a b c", "d e f"))


def test_score_is_lm_evals_string_match_all():
    from lm_eval.tasks.ruler.common_utils import string_match_all

    cases = [("The numbers are 123 and 456.", ("123", "456", "789")), ("nothing", ("1",)),
             ("ABC-def", ("abc-DEF",)), ("1234567", ("1234567",))]
    for out, answers in cases:
        assert R.score(out, answers) == pytest.approx(string_match_all([out], [list(answers)]))


def test_intervals_are_wilson_or_bootstrap_and_never_zero_width():
    from pecli.measures.intervals import wilson

    assert R.interval([1.0, 1.0, 1.0], 1000, 0)[:2] == wilson(3, 3)
    low, high, how = R.interval([0.5, 0.5, 0.5], 1000, 0)
    assert high > low and "Wilson" in how
    low, high, how = R.interval([0.2, 0.6, 1.0, 0.0], 1000, 0)
    assert low < 0.45 < high and "bootstrap" in how
    assert all(np.isnan(R.interval([1.0], 1000, 0)[:2]))


def test_each_condition_gets_its_paired_difference_from_intact():
    """Samples paired by index, whatever their order: Newcombe's paired interval where recall
    is 0 or 1, else the paired bootstrap written literally (the same resampled samples for
    both); NaN on intact and where a condition scored nothing."""
    from pecli.measures.intervals import paired_proportion_difference, proper

    rng = np.random.default_rng(1)
    right = {"intact": rng.integers(0, 2, 20).astype(float), "x": rng.integers(0, 2, 20).astype(float)}
    recall = {"intact": rng.choice([0.0, 0.25, 0.5, 1.0], 20), "x": rng.choice([0.0, 0.25, 0.5, 1.0], 20)}
    rows = [{"model": "m", "condition": c, "task": task, "length": 1024, "sample": i, "tokens": 1,
             "value": float(v[c][i]), "note": ""}
            for task, v in (("niah", right), ("cwe", recall)) for c in ("intact", "x")
            for i in rng.permutation(20)]  # each condition's samples in its own order
    rows += [{**r, "condition": "past", "value": float("nan"), "note": "not applicable"}
             for r in rows if r["condition"] == "x"]
    got = {(r["condition"], r["task"]): r for r in R.accuracy(rows, 1000, 7)}
    diff = lambda r: (r["diff_vs_intact"], r["diff_ci_low"], r["diff_ci_high"])  # noqa: E731
    assert diff(got["x", "niah"]) == paired_proportion_difference(right["x"], right["intact"])
    idx = np.random.default_rng(7).integers(0, 20, size=(1000, 20))
    stats = recall["x"][idx].mean(1) - recall["intact"][idx].mean(1)
    want = (recall["x"].mean() - recall["intact"].mean(), *proper(*np.percentile(stats, [2.5, 97.5])))
    assert diff(got["x", "cwe"]) == pytest.approx(want, abs=1e-12)
    assert all(np.isnan(diff(got[c, t])).all() for c in ("intact", "past") for t in ("niah", "cwe"))


def test_a_sections_table_summarised_again_gains_its_paired_differences(tiny, tmp_path, hay, monkeypatch):
    """resummarize_ruler: a ruler.csv written before the paired differences becomes what a run
    today writes from its samples, every other cell unchanged; a second pass changes nothing;
    a table whose cells disagree with its samples is refused."""
    import io
    import json

    import pandas as pd

    from pecli.experiments.migrate import resummarize_ruler
    from pecli.measures.intervals import DIFF_COLUMNS
    from pecli.runs.io import write_csv, write_json
    from pecli.runs.provenance import read_sha256

    monkeypatch.setattr("pecli.experiments.ruler.essay", lambda *a: hay)
    o = RulerOptions.build({"model": "tiny", "tasks": "vt,niah_single_1", "lengths": "320",
                            "samples": 3, "intervention": "zero"}, "test")
    tables = run(o, loaded=tiny("llama", max_position_embeddings=512))
    section = tmp_path / "s"
    section.mkdir()
    before = tables["ruler"].drop(columns=list(DIFF_COLUMNS))
    csv = write_csv(before, section / "ruler.csv")
    write_csv(tables["ruler_samples"], section / "ruler_samples.csv")
    write_json({"table_sha256": read_sha256(csv)}, section / "ruler.json")
    write_json({"config": {"options": {"samples": 3}}}, section / "done.json")
    assert resummarize_ruler(csv) and not resummarize_ruler(csv)
    after = pd.read_csv(csv, dtype=str, keep_default_na=False)
    fresh = pd.read_csv(io.StringIO(tables["ruler"].to_csv(index=False)), dtype=str, keep_default_na=False)
    assert after.equals(fresh[after.columns]) and set(after.columns) == set(fresh.columns)
    assert (after[after["condition"] == "zero"]["diff_vs_intact"] != "").all()
    meta = json.loads((section / "ruler.json").read_text())
    assert meta["table_sha256"] == read_sha256(csv) != meta["resummarized"]["table_sha256_before"]
    write_csv(before.assign(all_right=before["all_right"] + 1), csv)
    with pytest.raises(RuntimeError, match="all_right"):
        resummarize_ruler(csv)


@pytest.mark.parametrize("values, words", [
    ({"tasks": "niah_single_1,qb"}, "not a RULER task"),
    ({"tasks": "cwe", "lengths": "512"}, "give at least 1024"),
    ({"tasks": "vt", "lengths": "100"}, "shorter than vt's template"),
    ({"protocol": "study"}, "drop --protocol"),
])
def test_bad_options_are_refused_in_one_line(values, words):
    with pytest.raises(ConfigError, match=words) as err:
        RulerOptions.build({"model": "llama", **values}, "test")
    assert "\n" not in str(err.value)


def test_two_runs_give_identical_samples_and_answers(tiny, tmp_path, hay, monkeypatch):
    monkeypatch.setattr("pecli.experiments.ruler.essay", lambda *a: hay)
    o = RulerOptions.build({"model": "tiny", "tasks": "vt", "lengths": "320",
                            "samples": 2, "intervention": "zero"}, "test")
    a, b = (run(o, loaded=tiny("llama", max_position_embeddings=512)) for _ in range(2))
    cols = ["condition", "task", "sample", "depth", "tokens", "answers", "output", "value", "prompt"]
    assert a["ruler_samples"][cols].equals(b["ruler_samples"][cols])
    s = a["ruler_samples"]
    assert list(dict.fromkeys(s["condition"])) == ["intact", "zero"]
    assert (s[s["condition"] == "intact"]["prompt"] != "").all() and (s[s["condition"] == "zero"]["prompt"] == "").all()
    acc = a["ruler"]
    assert len(acc) == 2 and acc["samples"].eq(2).all() and (acc["ci_high"] > acc["ci_low"]).all()


def test_an_interrupted_run_decodes_only_what_it_had_not(tiny, hay, monkeypatch, interrupt):
    """Each finished (condition, task, length) is saved; a rerun after Ctrl-C decodes the rest
    and gives the uninterrupted run's table."""
    from pecli.measures import passkey

    monkeypatch.setattr("pecli.experiments.ruler.essay", lambda *a: hay)
    loaded = tiny("llama", max_position_embeddings=1024)
    o = RulerOptions.build({"model": "tiny", "tasks": "vt,niah_single_1", "lengths": "320",
                            "samples": 2, "intervention": "zero"}, "test")
    full = run(o, loaded=loaded)["ruler_samples"]
    calls = interrupt(passkey, "decode", 3)  # intact's two cells done, zero's first interrupted
    with pytest.raises(KeyboardInterrupt):
        run(o, loaded=loaded)
    calls.clear()
    resumed = run(o, loaded=loaded)["ruler_samples"]
    assert len(calls) == 2  # zero's two cells only
    cols = ["condition", "task", "sample", "answers", "output", "value", "prompt"]
    assert resumed[cols].equals(full[cols])


def test_decoding_stops_at_the_cells_budget_and_batches_give_one_by_ones_answers(tiny, hay):
    """The budget covers every expected answer's tokens and no more than RULER's new tokens;
    what it decodes is the start of what RULER's 128 tokens decode (greedy); a batch of N
    equal-length prompts decodes what each decodes alone."""
    from dataclasses import replace

    from pecli.measures.passkey import decode

    loaded = tiny("llama", max_position_embeddings=1024)
    tok = loaded.tokenizer
    samples = [R.fit(tok, "niah_single_2", 0, 512, i, hay) for i in range(4)]
    budget = R.decode_budget(tok, samples)
    need = max(len(tok(R.expected_text(s.task, s.answers), add_special_tokens=False)["input_ids"])
               for s in samples)
    assert need + 4 <= budget < R.TASKS["niah_single_2"].new_tokens
    short, full = (decode(loaded, samples[:2], 1, new_tokens=n) for n in (budget, 128))
    assert all(f.startswith(s) and len(tok(s, add_special_tokens=False)["input_ids"]) <= budget
               for s, f in zip(short, full, strict=True)) and short != full
    n = min(len(s.ids) for s in samples)
    same = [replace(s, ids=s.ids[:n]) for s in samples]  # one token count: one batch
    assert decode(loaded, same, 4, new_tokens=budget) == [decode(loaded, [s], 1, new_tokens=budget)[0]
                                                           for s in same]


def test_essay_refuses_a_missing_file(tmp_path):
    from pecli.runs.errors import DataError

    with pytest.raises(DataError, match="not found"):
        essay(str(tmp_path / "none.txt"))
    short = tmp_path / "short.txt"
    short.write_text("A b c. Too short to hide needles in.", encoding="utf-8")
    with pytest.raises(DataError, match=r"2 sentence\(s\) and 3 distinct words of 4-10 lowercase "
                                         "letters; give a text of at least 100 sentences"):
        essay(str(short))
    (tmp_path / "essay.csv").write_text("text\nA review.\n", encoding="utf-8")
    for not_a_file in (tmp_path / "none", tmp_path, tmp_path / "essay.csv"):  # not a dataset's name
        with pytest.raises(DataError, match=r"is not a \.txt/\.md file; give a plain text file or a dataset"):
            essay(str(not_a_file))


def test_every_row_names_its_haystacks_hash(tiny, tmp_path):
    """A file's haystack: the sha256 of its bytes, in every row (data_revision), so a table
    says which text the model read; editing one byte changes it."""
    import hashlib

    text = made_up().sentences
    path = tmp_path / "hay.txt"
    path.write_text(" ".join(text), encoding="utf-8")
    o = RulerOptions.build({"model": "tiny", "tasks": "vt", "lengths": "320", "samples": 1,
                            "haystack": str(path)}, "test")
    got = run(o, loaded=tiny("llama", max_position_embeddings=512))
    want = "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    assert set(got["ruler"]["data_revision"]) == set(got["ruler_samples"]["data_revision"]) == {want}
    path.write_text(" ".join(text) + " One more.", encoding="utf-8")
    essay.cache_clear()
    assert essay(str(path)).revision not in ("", want)


def test_a_datasets_haystack_carries_its_revision_and_qa_truthfulqas(shared_data):
    hay = essay("imdb", str(shared_data), True)
    assert hay.revision == load_data_revision("imdb", shared_data)
    assert hay.qa and hay.qa_revision == load_data_revision("truthfulqa", shared_data)


def load_data_revision(name, root) -> str:
    from pecli.data.datasets import load_data

    return load_data(name, data_dir_=str(root)).revision


@pytest.mark.parametrize("task, length", [("vt", 320), ("qa", 512)])
def test_the_lm_eval_route_gives_pecli_rulers_samples_outputs_and_scores(tiny, hay, monkeypatch, task, length):
    """configs/lm_eval/ruler_{vt,qa}.yaml through `pecli`'s lm-eval model: the same documents
    as `pecli ruler` builds, the same budgets, greedy outputs and recalls."""
    lm_eval = pytest.importorskip("lm_eval", reason="lm-eval not installed (make setup)")
    from pathlib import Path

    from lm_eval.tasks import TaskManager

    from pecli.integrations import lm_eval as plugin

    loaded = tiny("llama", max_position_embeddings=512)
    monkeypatch.setattr("pecli.experiments.ruler.essay", lambda *a: hay)
    monkeypatch.setattr("pecli.models.loading.load_model", lambda *a, **k: loaded)
    o = RulerOptions.build({"model": "tiny", "tasks": task, "lengths": str(length), "samples": 2}, "test")
    ours = run(o, loaded=loaded)["ruler_samples"]
    meta = {"pretrained": "tiny", "ruler_tasks": task, "ruler_lengths": [length], "ruler_samples": 2}
    configs = Path(__file__).resolve().parents[2] / "configs" / "lm_eval"
    manager = TaskManager(include_path=str(configs), metadata=meta)
    docs = list(manager.load_task_or_group([f"ruler_{task}"])[f"ruler_{task}"].test_docs())
    assert [d["prompt"] for d in docs] == list(ours["prompt"])
    lm = plugin.PecliLM(pretrained="tiny", loaded=loaded, batch_size=1)
    try:
        out = lm_eval.simple_evaluate(model=lm, tasks=[f"ruler_{task}"], task_manager=manager)
    finally:
        lm.close()
    samples = sorted(out["samples"][f"ruler_{task}"], key=lambda s: s["doc_id"])
    assert [s["resps"][0][0] for s in samples] == list(ours["output"])
    assert [s["recall"] for s in samples] == list(ours["value"])
    assert [d["max_new_tokens"] for d in docs] == list(ours["max_new_tokens"])


def test_cwe_baselines_read_the_asked_list_not_the_example(tok, hay):
    """The random pick's expected recall is 10 over the asked list's distinct words, and the
    last ten distinct words are scored as an output would be; the worked example's list (its
    own answer included) is not read."""
    s = R.fit(tok, "cwe", 0, 1024, 0, hay)
    asked = s.text.rsplit("\nQuestion", 1)[0].rsplit("\n", 1)[1].split()[1::2]
    last = list(dict.fromkeys(asked[::-1]))[:10]
    chance, recent = R.cwe_baselines(s.text, s.answers)
    assert chance == pytest.approx(10 / len(set(asked)))
    assert recent == sum(a in last for a in s.answers) / 10
    made = R.CWE.format(context="1. x 2. y 3. x 4. z 5. x") + R.CWE_PREFIX
    assert R.cwe_baselines("example: " + R.CWE.format(context="1. q 2. q") + " 1. q\n" + made, ("x", "q")) == (1.0, 0.5)


@pytest.mark.parametrize("section, chance, recent, below", [
    ("ruler-gemma3-inside-cwe", [0.20, 0.05, 0.17], [0.555, 0.19, 0.64],
     [(-0.37, -0.5, -0.225), (-0.19, -0.24, -0.145), (-0.565, -0.65, -0.465)]),
    ("ruler-smollm2-inside", [0.24, 0.05, 0.21], [0.52, 0.22, 0.655],
     [(-0.45, -0.51, -0.385), (-0.2, -0.26, -0.145), (-0.6, -0.66, -0.54)]),
])
def test_the_committed_cwe_baselines_are_those_the_notes_give(section, chance, recent, below):
    """The cwe sections' notes: what ten random distinct words and the last ten distinct words
    recall at 1,024, 2,048 and 4,096 tokens, and the model minus the second, paired by sample."""
    from pathlib import Path

    import pandas as pd

    from pecli.measures.intervals import paired_mean_difference

    s = pd.read_csv(Path(__file__).resolve().parents[2] / "results" / "offline" / section
                    / "ruler_samples.csv", dtype={"answers": str})
    s = s[s["task"] == "cwe"]
    s[["chance", "recent"]] = [R.cwe_baselines(p, a.split("|")) for p, a in zip(s["prompt"], s["answers"], strict=True)]
    means = s.groupby("length")[["value", "chance", "recent"]].mean()
    assert means["chance"].round(2).tolist() == chance
    assert means["recent"].tolist() == pytest.approx(recent)
    got = [paired_mean_difference(part["value"], part["recent"]) for _, part in s.groupby("length")]
    assert got == [pytest.approx(x) for x in below]


def test_the_committed_single_needle_past_the_context_against_other_cells():
    """ruler-smollm2-past-single's notes and its finding compare its Self-Extend cell with cells
    of other samples (the multi-key needle under the same remedy, the single needle inside the
    context): Newcombe's interval for independent proportions from the committed counts, as
    the notes print it."""
    from pathlib import Path

    import pandas as pd

    from pecli.experiments.reproduce import load_preset
    from pecli.measures.intervals import independent_proportion_difference

    out = Path(__file__).resolve().parents[2] / "results" / "offline"

    def right(section, task, length, condition):
        t = pd.read_csv(out / section / "ruler.csv")
        (row,) = t[(t.task == task) & (t.length == length) & (t.condition == condition)].itertuples()
        return row.all_right, row.samples

    single = right("ruler-smollm2-past-single", "niah_single_1", 16384, "selfextend:4:2048")
    keys = right("ruler-smollm2-past", "niah_multikey_1", 16384, "selfextend:4:2048")
    inside = right("ruler-smollm2-inside", "niah_single_1", 4096, "intact")
    assert (single, keys, inside) == ((17, 20), (10, 20), (19, 20))
    preset = load_preset("offline")
    notes = next(e.study_notes for e in preset.entries if e.id == "ruler-smollm2-past-single")
    finding = next(f.text for f in preset.findings if f.section == "ruler-smollm2-past-single")
    d, low, high = independent_proportion_difference(*single, *keys)
    assert f"{d:+.2f} [{low:+.2f}, {high:+.2f}]" in " ".join(notes.split())
    assert f"{d:.2f} [{low:.2f}, {high:.2f}] fewer" in " ".join(finding.split())
    d, low, high = independent_proportion_difference(*single, *inside)
    assert f"{d:+.2f} [{low:+.2f}, {high:+.2f}]" in " ".join(notes.split())


def test_the_committed_single_needle_remedies_against_selfextend_and_the_multikey_needle():
    """ruler-smollm2-past-single-remedies' notes compare STRING and DCA with Self-Extend, run in
    another section on the same 20 prompts (checked here): Newcombe's interval for paired
    proportions, sample by sample; and with the same remedy on the multi-key needle (other
    samples: the interval for independent proportions). Computed from the committed samples."""
    from pathlib import Path

    import pandas as pd

    from pecli.experiments.reproduce import load_preset
    from pecli.measures.intervals import (
        independent_proportion_difference,
        paired_proportion_difference,
    )

    out = Path(__file__).resolve().parents[2] / "results" / "offline"

    def cells(section):
        s = pd.read_csv(out / section / "ruler_samples.csv", keep_default_na=False, dtype=str)
        return {c: part.assign(sample=part["sample"].astype(int)).sort_values("sample").reset_index(drop=True)
                for c, part in s.groupby("condition")}

    new, single = cells("ruler-smollm2-past-single-remedies"), cells("ruler-smollm2-past-single")
    assert new["intact"].prompt.tolist() == single["intact"].prompt.tolist()  # the same 20 prompts
    assert new["intact"].output.tolist() == single["intact"].output.tolist()  # prediction (1)
    selfextend = single["selfextend:4:2048"].value.astype(float).to_numpy()
    keys = pd.read_csv(out / "ruler-smollm2-past-remedies" / "ruler.csv").set_index("condition")
    notes = " ".join(next(e.study_notes for e in load_preset("offline").entries
                          if e.id == "ruler-smollm2-past-single-remedies").split())
    for condition in ("string:8192", "dca:8192"):
        right = new[condition].value.astype(float).to_numpy()
        d, low, high = paired_proportion_difference(right, selfextend)
        assert f"{d:+.2f} [{low:+.2f}, {high:+.2f}]" in notes, condition
        d, low, high = independent_proportion_difference(int(right.sum()), len(right),
                                                         int(keys.loc[condition, "all_right"]),
                                                         int(keys.loc[condition, "samples"]))
        assert f"{d:+.2f} [{low:+.2f}, {high:+.2f}]" in notes, condition
