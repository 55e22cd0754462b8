"""RULER's synthetic long-context tasks (Hsieh et al. 2024, "RULER: What's the Real Context
Size of Your Long-Context Language Models?", NVIDIA/RULER), built offline and seeded.

Each task writes RULER's template, its answer prefix and its needles (the counts of RULER's
scripts/synthetic.yaml), sized to a length in the model's own tokens as RULER sizes it: the
prompt plus the tokens the task may generate fit the length (binary search over the
haystack's size). Scoring is RULER's: the recall of the expected strings in the output
(`string_match_all`: the share of answers found, case-insensitive substrings). A cell's
accuracy is the mean recall over its samples (`accuracy`), with its interval over samples and
each condition's difference from intact on the same samples (`interval`, `_paired_with_intact`).

Where pecli differs from RULER, and why:
- The essay haystack (niah_single_2/3, multikey_1, multivalue, multiquery) is IMDB reviews
  (or TruthfulQA answers, or any --haystack file) instead of Paul Graham's essays, which
  RULER downloads: nothing here may reach the network. Each sample takes its own slice of
  sentences, from a seeded start.
- Keys ("words") are two words of the haystack's own vocabulary joined by a hyphen, and the
  common/frequent-words tasks draw from that vocabulary too, where RULER uses the
  wonderwords lists (another package and its word files).
- vt has two chains, one queried and one distractor (RULER's synthetic.yaml: one), as issue
  48 asks for distractor chains.
- No sample contains an answer by chance: each answer is looked for (a whole word,
  case-insensitive) in everything but its own needles; a sample that has one is drawn again
  with the next attempt's seed, and after ATTEMPTS a ValueError says so (RULER does not check).
- Decoding stops after the tokens the cell's longest expected answer needs (`decode_budget`:
  the answers written as the answer prefix continues, in the model's tokens, plus a quarter
  and at least 4 more), at most RULER's tokens_to_generate, which still sizes the prompt. An
  answer the model writes only after a longer preamble is missed where RULER's budget would
  find it; the budget sits in every row (max_new_tokens).
- qa's documents are TruthfulQA's (the data directory), where RULER uses SQuAD and HotpotQA
  (downloaded): an item's document is its correct answers, written as sentences; the
  distractors are other items' documents. The expected strings are the item's correct answers
  of at least 3 words that occur in no other item's document and not in the question (short
  answers such as "No" occur everywhere); items with none are never asked. Scored by RULER's
  string_match_part (1 where any expected string is in the output; lm-eval's port takes the
  share found instead).
"""

from __future__ import annotations

import re
import string
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NIAH = ("Some special magic {v} are hidden within the following text. Make sure to memorize it. "
        "I will quiz you about the {v} afterwards.\n{context}\nWhat are all the special magic {v} "
        "for {query} mentioned in the provided text?")
NIAH_PREFIX = " The special magic {v} for {query} mentioned in the provided text are"
NEEDLE = "One of the special magic {v} for {key} is: {value}."
VT = ("Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
      "{context}\nQuestion: Find all variables that are assigned the value {query} in the text above.")
VT_PREFIX = (" Answer: According to the chain(s) of variable assignment in the text above, {n} "
             "variables are assgined the value {query}, they are: ")  # RULER's spelling
CWE = ("Below is a numbered list of words. In these words, some appear more often than others. "
       "Memorize the ones that appear most often.\n{context}\nQuestion: What are the 10 most "
       "common words in the above list?")
CWE_PREFIX = " Answer: The top 10 words that appear most often in the list are:"
FWE = ("Read the following coded text and track the frequency of each coded word. Find the three "
       "most frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. "
       "Please ignore the dots '....'. What are the three most frequently appeared words in the "
       "above coded text?")
FWE_PREFIX = " Answer: According to the coded text above, the three most frequently appeared words are:"
QA = ("Answer the question based on the given documents. Only give me the answer and do not output "
      "any other words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question "
      "based on the given documents. Only give me the answer and do not output any other words."
      "\n\nQuestion: {query}")
QA_PREFIX = " Answer:"
DOCUMENT = "Document {i}:\n{document}"
QA_WORDS = 3  # an expected qa answer has at least this many words
DEPTHS = np.round(np.linspace(0, 100, 40)).astype(int)  # RULER's needle depths, in percent
ATTEMPTS = 20  # draws of a sample before an answer found in its haystack is an error


@dataclass(frozen=True)
class Task:
    """One RULER task: how its needles and haystack are drawn, and how much it may generate."""

    name: str
    family: str  # niah, vt, cwe, fwe, qa
    new_tokens: int  # RULER's tokens_to_generate
    haystack: str = ""  # niah: noise (RULER's "repeat"), essay or needle
    keys: int = 1  # niah: needles with distinct keys (num_needle_k)
    values: int = 1  # values per key (num_needle_v)
    queries: int = 1  # keys asked for (num_needle_q)
    key_type: str = "words"
    value_type: str = "numbers"
    min_length: int = 256  # shorter lengths are refused when the options are checked
    match: str = "all"  # RULER's string_match_all, or "part" (any expected string)


TASKS: dict[str, Task] = {t.name: t for t in (
    Task("niah_single_1", "niah", 128, "noise"),
    Task("niah_single_2", "niah", 128, "essay"),
    Task("niah_single_3", "niah", 128, "essay", value_type="uuids"),
    Task("niah_multikey_1", "niah", 128, "essay", keys=4),
    Task("niah_multikey_2", "niah", 128, "needle"),
    Task("niah_multikey_3", "niah", 128, "needle", key_type="uuids", value_type="uuids"),
    Task("niah_multivalue", "niah", 128, "essay", values=4),
    Task("niah_multiquery", "niah", 128, "essay", keys=4, queries=4),
    Task("vt", "vt", 30, min_length=256),
    Task("cwe", "cwe", 120, min_length=1024),
    Task("fwe", "fwe", 50, min_length=512),
    Task("qa", "qa", 32, min_length=512, match="part"),
)}
VT_HOPS, VT_CHAINS = 4, 2  # RULER's num_hops; its chains plus one distractor chain


@dataclass(frozen=True)
class QAItem:
    """One qa item: its question, its document, and the answers it may be asked for."""

    question: str
    document: str  # its correct answers, as sentences
    answers: tuple[str, ...]  # its own: in its document, in no other, not in its question


def qa_items(questions: list[str], correct: list[list[str]]) -> tuple[QAItem, ...]:
    """Question-answering items from questions and their correct answers (module docstring)."""
    docs = [" ".join(a.strip().rstrip(".") + "." for a in answers if a.strip()) for answers in correct]
    lowered = [d.lower() for d in docs]
    items = []
    for q, answers, doc in zip(questions, correct, docs, strict=True):
        own = [a.strip().rstrip(".") for a in answers if len(a.split()) >= QA_WORDS]
        own = [a for a in dict.fromkeys(own) if not found_in(a, q)
               and sum(a.lower() in d for d in lowered) == 1]
        items.append(QAItem(q, doc, tuple(own)))
    return tuple(items)


@dataclass(frozen=True)
class Haystack:
    """The essay haystack: its sentences, in order, and its vocabulary (keys, cwe's words);
    with the qa items where qa is asked for."""

    name: str
    sentences: tuple[str, ...]
    words: tuple[str, ...]  # lowercase alphabetic words of 4 to 10 letters, sorted
    qa: tuple[QAItem, ...] = ()
    revision: str = ""  # the source's hash (sha256:...), as a dataset's data_revision
    qa_revision: str = ""  # TruthfulQA's, where the qa items are loaded


def haystack_of(texts: list[str], name: str) -> Haystack:
    """Sentences of `texts` (markup removed, split after . ! ?) and their vocabulary."""
    sentences = []
    for text in texts:
        text = re.sub(r"<[^>]+>", " ", text)
        sentences += [s for s in re.split(r"(?<=[.!?])\s+", " ".join(text.split())) if s]
    words = sorted({w for w in re.findall(r"\b[a-z]{4,10}\b", " ".join(sentences))})
    if len(sentences) < 100 or len(words) < 1000:
        raise ValueError(f"haystack {name}: {len(sentences)} sentence(s) and {len(words)} distinct "
                         "words of 4-10 lowercase letters; give a text of at least 100 sentences "
                         "and 1,000 such words")
    return Haystack(name, tuple(sentences), tuple(words))


@dataclass(frozen=True)
class Sample:
    task: str
    length: int  # asked for: the prompt and the task's new tokens
    index: int
    attempt: int  # draws before this one whose haystack held an answer
    text: str  # template and answer prefix: what the model reads
    ids: tuple[int, ...]
    answers: tuple[str, ...]
    depth: float | None  # niah/vt: where the (first) queried needle sits, 0 to 1 of the context
    start: int | None  # essay: the first sentence of the slice
    size: int  # haystack units (sentences, words, needles)


@dataclass(frozen=True)
class Drawn:
    text: str
    answers: tuple[str, ...]
    rest: str  # everything but the answers' own needles: no answer may occur in it
    depth: float | None = None
    start: int | None = None


def _rng(seed: int, task: str, length: int, index: int, attempt: int) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(task.encode()), length, index, attempt])


def _uuid(rng) -> str:
    h = "".join(rng.choice(list("0123456789abcdef"), 32))
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{'89ab'[int(h[16], 16) % 4]}{h[17:20]}-{h[20:]}"


def _draw(kind: str, rng, hay: Haystack) -> str:
    if kind == "numbers":
        return str(int(rng.integers(10**6, 10**7)))
    if kind == "uuids":
        return _uuid(rng)
    a, b = rng.choice(len(hay.words), 2, replace=False)
    return f"{hay.words[a]}-{hay.words[b]}"


def _niah(t: Task, seed_rng: Callable[[], np.random.Generator], hay: Haystack, size: int) -> Drawn:
    rng = seed_rng()
    v = t.value_type
    keys = list(dict.fromkeys(_draw(t.key_type, rng, hay) for _ in range(t.keys)))
    values = [[_draw(v, rng, hay) for _ in range(t.values)] for _ in keys]
    needles = [NEEDLE.format(v=v, key=k, value=x) for k, vs in zip(keys, values, strict=True) for x in vs]
    owner = [i for i, vs in enumerate(values) for _ in vs]  # the key of each needle
    order = rng.permutation(len(needles))
    queried = sorted(rng.choice(len(keys), t.queries, replace=False).tolist())
    start = None
    if t.haystack == "essay":
        start = int(rng.integers(len(hay.sentences)))
        units = [hay.sentences[(start + i) % len(hay.sentences)] for i in range(size)]
    elif t.haystack == "noise":
        units = [NOISE] * size
    else:  # RULER's "needle" haystack: needles of other keys and values
        units = [NEEDLE.format(v=v, key=_draw(t.key_type, rng, hay), value=_draw(v, rng, hay))
                 for _ in range(size)]
    at = sorted(int(size * d / 100) for d in rng.choice(DEPTHS, len(needles), replace=False))
    parts, depth, done = [], None, 0
    for pos, n in zip(at, order, strict=True):
        parts += units[done:pos]
        done = pos
        if depth is None and owner[n] in queried:
            depth = pos / max(size, 1)
        parts.append(needles[n])
    parts += units[done:]
    context = (" " if t.haystack == "essay" else "\n").join(parts)
    rest = "\n".join([*units, *(needles[n] for n in order if owner[n] not in queried)])
    query = keys[queried[0]] if t.queries == 1 else ", ".join(keys[i] for i in queried[:-1]) + \
        ", and " + keys[queried[-1]]
    template, prefix, vv = NIAH, NIAH_PREFIX, v
    if t.queries * t.values == 1:  # RULER's singular wording
        template = template.replace("Some", "A").replace("are all", "is").replace("are", "is")
        prefix, vv = prefix.replace("are", "is"), v[:-1]
    text = template.format(v=vv, context=context, query=query) + prefix.format(v=vv, query=query)
    return Drawn(text, tuple(x for i in queried for x in values[i]), rest, depth, start)


def _vt(t: Task, seed_rng, hay: Haystack, size: int) -> Drawn:
    rng = seed_rng()
    names: list[str] = []
    while len(names) < VT_CHAINS * (VT_HOPS + 1):
        name = "".join(rng.choice(list(string.ascii_uppercase), 5))
        names += [name] if name not in names else []
    chains, values = [], []
    for c in range(VT_CHAINS):
        vs = names[c * (VT_HOPS + 1):(c + 1) * (VT_HOPS + 1)]
        value = str(int(rng.integers(10000, 100000)))
        while value in values:
            value = str(int(rng.integers(10000, 100000)))
        values.append(value)
        chains.append([f"VAR {vs[0]} = {value}", *(f"VAR {b} = VAR {a} " for a, b in zip(vs, vs[1:], strict=False))])
    sentences = [NOISE + "\n"] * size
    depth = None
    for c, chain in enumerate(chains):  # RULER's: each chain at sorted random places
        places = sorted(rng.choice(len(sentences) + 1, len(chain)).tolist())  # with repeats
        for j, (p, line) in enumerate(zip(places, chain, strict=True)):
            if c == 0 and j == 0:
                depth = p / max(size, 1)
            sentences.insert(p + j, line)
    context = " ".join(sentences).replace(". \n", ".\n")
    rest = "\n".join([NOISE, *chains[1]])
    text = VT.format(context=context, query=values[0]) + VT_PREFIX.format(n=VT_HOPS + 1, query=values[0])
    return Drawn(text, tuple(names[:VT_HOPS + 1]), rest, depth)


def _cwe(length: int, seed_rng, hay: Haystack, size: int) -> Drawn:
    rng = seed_rng()
    # RULER: below 4,096 tokens an example of 20 words (3 and 1 times) and common words 6 times,
    # uncommon once; else 40 words (10 and 3 times) and 30 and 3 times
    (ex_n, ex_c, ex_u), (c, u) = ((20, 3, 1), (6, 1)) if length < 4096 else ((40, 10, 3), (30, 3))
    picked = [hay.words[i] for i in rng.choice(len(hay.words), ex_n + 10 + size, replace=False)]
    example, common, uncommon = picked[:ex_n], picked[ex_n:ex_n + 10], picked[ex_n + 10:]

    def listed(cw, ucw, fc, fu):
        words = cw * fc + ucw * fu
        words = [words[i] for i in rng.permutation(len(words))]
        return " ".join(f"{i + 1}. {w}" for i, w in enumerate(words))

    shown = CWE.format(context=listed(example[:10], example[10:], ex_c, ex_u)) + CWE_PREFIX + " " + \
        " ".join(f"{i + 1}. {w}" for i, w in enumerate(example[:10]))
    context = listed(common, uncommon, c, u)
    text = shown + "\n" + CWE.format(context=context) + CWE_PREFIX
    return Drawn(text, tuple(common), "\n".join([shown, *uncommon]))


def _fwe(length: int, seed_rng, hay: Haystack, size: int) -> Drawn:
    rng = seed_rng()
    vocab: list[str] = []
    while len(vocab) < max(length // 50, 5):  # RULER: 6-letter coded words, length // 50 of them
        w = "".join(rng.choice(list(string.ascii_lowercase), 6))
        vocab += [w] if w not in vocab else []
    vocab[0] = "..."  # RULER: the most frequent one is noise
    k = np.arange(1, len(vocab) + 1)
    counts = (size * k ** -2.0 / (np.pi ** 2 / 6)).astype(int)  # Zipf, alpha 2 (zeta(2) = pi^2/6)
    words = [w for w, n in zip(vocab, counts, strict=True) for _ in range(n)]
    words = [words[i] for i in rng.permutation(len(words))]
    text = FWE.format(context=" ".join(words)) + FWE_PREFIX
    rest = " ".join(w for w, n in zip(vocab[4:], counts[4:], strict=True) if n)
    if counts[3] <= counts[4]:  # too few words to rank the three apart from the rest
        rest += " " + " ".join(vocab[1:4])
    return Drawn(text, tuple(vocab[1:4]), rest)


def _qa(seed_rng, hay: Haystack, size: int) -> Drawn:
    rng = seed_rng()
    asked = [i for i, item in enumerate(hay.qa) if item.answers]
    gold = asked[int(rng.integers(len(asked)))]
    others = [int(i) for i in rng.permutation(len(hay.qa)) if i != gold][:size]
    at = int(rng.integers(len(others) + 1))
    docs = [hay.qa[i].document for i in others]
    docs.insert(at, hay.qa[gold].document)
    context = "\n\n".join(DOCUMENT.format(i=i + 1, document=d) for i, d in enumerate(docs))
    question = hay.qa[gold].question
    text = QA.format(context=context, query=question) + QA_PREFIX
    rest = "\n".join([question, *(hay.qa[i].document for i in others)])
    return Drawn(text, hay.qa[gold].answers, rest, at / max(len(others), 1))


def draw(task: str, seed: int, length: int, index: int, attempt: int, hay: Haystack, size: int) -> Drawn:
    """One sample's text and answers with `size` haystack units (pure: the same for the same
    arguments)."""
    t = TASKS[task]

    def seeded():
        return _rng(seed, task, length, index, attempt)

    if t.family == "niah":
        return _niah(t, seeded, hay, size)
    if t.family == "vt":
        return _vt(t, seeded, hay, size)
    if t.family == "qa":
        return _qa(seeded, hay, size)
    return (_cwe if t.family == "cwe" else _fwe)(length, seeded, hay, size)


def found_in(answer: str, text: str) -> bool:
    """Whether `answer` occurs in `text` as a whole word, case-insensitive."""
    return re.search(rf"(?<![\w-]){re.escape(answer)}(?![\w-])", text, re.IGNORECASE) is not None


def fit(tokenizer, task: str, seed: int, length: int, index: int, hay: Haystack) -> Sample | None:
    """The sample with the most haystack whose tokens plus the task's new tokens are at most
    `length` (RULER's sizing); None if even the smallest haystack does not fit. An answer
    found in the rest of the text draws the sample again (next attempt); ValueError after
    ATTEMPTS."""
    t = TASKS[task]
    budget = length - t.new_tokens
    smallest = {"niah": 2, "vt": 2, "cwe": 0, "fwe": 200, "qa": 0}[t.family]  # haystack units at least
    most = len(hay.qa) - 1 if t.family == "qa" else None  # qa: every other item's document
    if t.family == "qa" and not any(item.answers for item in hay.qa):
        raise ValueError(f"qa needs question-answering items (TruthfulQA in the data directory); "
                         f"{hay.name} has none with an answer of its own")
    for attempt in range(ATTEMPTS):
        def tokens(size, attempt=attempt):
            drawn = draw(task, seed, length, index, attempt, hay, size)
            return drawn, tokenizer(drawn.text)["input_ids"]

        drawn, ids = tokens(smallest)
        if len(ids) > budget:
            return None
        low, high = smallest, max(smallest, 1) * 2
        while len(tokens(high)[1]) <= budget:  # then the largest size that fits
            if high == most:
                raise ValueError(f"{task} at {length} tokens: all {most + 1} documents take "
                                 f"fewer tokens; give shorter lengths")
            low, high = high, high * 2 if most is None else min(high * 2, most)
        while low < high - 1:
            mid = (low + high) // 2
            low, high = (mid, high) if len(tokens(mid)[1]) <= budget else (low, mid)
        drawn, ids = tokens(low)
        if not any(found_in(a, drawn.rest) for a in drawn.answers):
            return Sample(task, length, index, attempt, drawn.text, tuple(ids), drawn.answers,
                          drawn.depth, drawn.start, low)
    raise ValueError(f"{task} at {length} tokens, sample {index}: an answer occurs in the haystack "
                     f"in each of {ATTEMPTS} draws; give another --haystack")


def expected_text(task: str, answers: tuple[str, ...]) -> str:
    """The answers as the answer prefix continues: numbered (cwe), spaced (vt, whose prefix
    ends in a space), the longest (qa) or listed with a full stop (niah, fwe)."""
    family = TASKS[task].family
    if family == "cwe":
        return " " + " ".join(f"{i + 1}. {w}" for i, w in enumerate(answers))
    if family == "qa":  # any one of them is right: the longest
        return " " + max(answers, key=len) + "."
    return " ".join(answers) if family == "vt" else " " + ", ".join(answers) + "."


def decode_budget(tokenizer, samples: list[Sample]) -> int:
    """New tokens to decode for a cell's samples: the longest expected answer's tokens plus a
    quarter (at least 4), at most RULER's tokens_to_generate (module docstring)."""
    t = TASKS[samples[0].task]
    need = max(len(tokenizer(expected_text(s.task, s.answers), add_special_tokens=False)["input_ids"])
               for s in samples)
    return min(t.new_tokens, need + max(4, need // 4))


def score(output: str, answers: tuple[str, ...], match: str = "all") -> float:
    """RULER's string_match_all: the share of the answers found in the output (case-insensitive);
    string_match_part (`match` "part", qa): 1 where any of them is found, else 0."""
    out = output.lower()
    found = [a.lower() in out for a in answers]
    return float(any(found)) if match == "part" else sum(found) / len(answers)


def cwe_baselines(prompt: str, answers) -> tuple[float, float]:
    """Two cwe answers given without counting, scored as a model's (`score`): the expected
    recall of ten distinct words of the asked list picked at random (each answer is among them
    with chance 10 / the list's distinct words), and the recall of the list's last ten distinct
    words (the most recent ones)."""
    before, after = CWE.split("{context}")
    listed = prompt.rsplit(before, 1)[1].rsplit(after, 1)[0]
    words = listed.split()[1::2]  # "1. word 2. word ..."
    distinct = list(dict.fromkeys(words))
    last = list(dict.fromkeys(reversed(words)))[:10]
    return min(1.0, 10 / len(distinct)), score(expected_text("cwe", tuple(last)), tuple(answers))


def interval(values: list[float], n_boot: int, seed: int) -> tuple[float, float, str]:
    """A 95 % interval of the mean over samples by `accuracy_interval`: Wilson's where every
    sample is all-or-nothing, else a percentile bootstrap over samples; never of zero width (a
    bootstrap of equal partial recalls falls back to Wilson's on the expected number right).
    None with `n_boot` 0 or fewer than 2 samples."""
    from pecli.measures.intervals import MIN_TEXTS, accuracy_interval, accuracy_method, wilson

    low, high = accuracy_interval(values, n_boot=n_boot, seed=seed)
    if low == low:
        return low, high, accuracy_method(values, "samples")
    if n_boot and len(values) >= MIN_TEXTS:  # equal partial recalls: no bootstrap can vary
        return (*wilson(round(sum(values)), len(values)), "Wilson score interval over samples (equal values)")
    return low, high, ""


def accuracy(samples: list[dict], n_boot: int, seed: int) -> list[dict]:
    """Mean recall per (model, condition, task, length), with its interval over samples and its
    paired difference from intact (DIFF_COLUMNS)."""
    import pandas as pd

    df = pd.DataFrame(samples)
    keys = ["model", "condition", "task", "length"]
    rows = []
    for _, part in df.groupby(keys, sort=False, dropna=False):
        first = part.iloc[0].to_dict()
        scored = part[part["note"] == ""]
        values = [float(v) for v in scored["value"]]
        low, high, method = interval(values, n_boot, seed)
        keep = {k: v for k, v in first.items() if k not in (
            "sample", "attempt", "depth", "start", "size", "tokens", "answers", "output", "prompt",
            "value", "note")}
        rows.append({**keep, "metric": "accuracy", "value": sum(values) / len(values) if values
                     else float("nan"), "ci_low": low, "ci_high": high, "interval": method,
                     "all_right": sum(v == 1.0 for v in values), "samples": len(values),
                     "rows": len(part), "tokens": int(scored["tokens"].sum()) if values else 0,
                     "note": "" if values else first["note"]})
    return _paired_with_intact(df, rows, n_boot, seed)


def _paired_with_intact(samples: pd.DataFrame, rows: list[dict], n_boot: int, seed: int) -> list[dict]:
    """Each accuracy row's DIFF_COLUMNS against the intact model at the same model, task and
    length, the samples paired by index (one prompt read under both), bounded by
    `paired_mean_difference` (Newcombe's interval where every recall is 0 or 1, else a paired
    bootstrap over samples). NaN on intact's rows and where either condition scored no sample."""
    import pandas as pd

    from pecli.measures.intervals import DIFF_COLUMNS, paired_mean_difference

    scored = samples[samples["note"] == ""]
    by_sample = scored.set_index(["model", "condition", "task", "length", "sample"])["value"].astype(float)
    cells = set(by_sample.index.droplevel("sample"))
    for row in rows:
        diff = (float("nan"),) * 3
        here, intact = ((row["model"], c, row["task"], row["length"]) for c in (row["condition"], "intact"))
        if row["condition"] != "intact" and {here, intact} <= cells:
            x, ref = (by_sample.xs(cell, level=[0, 1, 2, 3]) for cell in (here, intact))
            pairs = pd.concat([x.rename("x"), ref.rename("ref")], axis=1, join="inner")
            if len(pairs):
                diff = paired_mean_difference(pairs["x"], pairs["ref"], n_boot=n_boot, seed=seed)
        row.update(zip(DIFF_COLUMNS, diff, strict=True))
    return rows
