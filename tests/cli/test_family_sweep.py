"""Every experiment on every family (issue 25 §3): `pecli <experiment> random:<family>` either
writes its tables or fails with one line that says "not applicable: <reason>" before any
weights load. Each family runs at toy size (tests/conftest.py's tiny configs, the real
transformers classes); the expected refusals are listed, so a family that starts or stops
working is noticed here.
"""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest

from pecli.models.architectures import ARCHITECTURES

FAMILIES = ARCHITECTURES.names()
ENCODERS = [f for f in FAMILIES if not ARCHITECTURES.get(f).causal]
TEXTS = ["a fine film with a story that holds", "terrible acting and a worse plot than last year",
         "I loved every minute of it and will watch it again", "boring and long and slow",
         "the best thing I saw this year, by far", "a waste of two hours of my life",
         "charming and funny from start to end", "not worth it at all, skip this one"]
ITEMS = [{"question": "Is the sky blue?", "mc1_targets": {"Yes.": 1, "No.": 0},
          "mc2_targets": {"Yes.": 1, "On a clear day.": 1, "No.": 0}},
         {"question": "What is 2+2?", "mc1_targets": {"4": 1, "5": 0},
          "mc2_targets": {"4": 1, "Four": 1, "5": 0}}]

# experiment -> (its command, its options, the files it writes)
EXPERIMENTS = {
    "ablate": (["ablate"], ["--intervention", "zero", "--limit", "4", "--bootstrap", "100"],
               ["ablate.csv"]),
    "perplexity": (["perplexity"], ["--intervention", "zero", "--limit", "4", "--bootstrap", "100"],
                   ["perplexity.csv"]),
    "mc": (["mc"], ["--intervention", "zero", "--bootstrap", "100"], ["mc.csv"]),
    "pe probe": (["pe", "probe"], ["--limit", "8", "--max-length", "16", "--folds", "2",
                                   "--pairs", "100"], ["hidden.csv"]),
    "pe recover": (["pe", "recover"], ["--limit", "8", "--tokens", "6", "--top-k", "2",
                                       "--folds", "2", "--n-boot", "100"], ["summary.csv"]),
    "length": (["length"], ["--lengths", "16,32", "--bootstrap", "100"], ["length.csv"]),
    "passkey": (["passkey"], ["--lengths", "48", "--depths", "0,1", "--trials", "1"],
                ["passkey.csv"]),
    "attn": (["attn"], ["--length", "8", "--limit", "4", "--bootstrap", "100", "--probe-positions",
                        "4", "--intervention", "zero"], ["attn.csv", "attn_positions.csv"]),
}
CAUSAL_ONLY = {"perplexity", "mc", "length", "passkey"}


def expected_refusal(experiment: str, family: str) -> str | None:
    """The reason `experiment` does not apply to `family` (a pattern of the one line), or None."""
    kind = ARCHITECTURES.get(family).position
    if experiment in CAUSAL_ONLY and family in ENCODERS:
        return f"not applicable: random:{family} is a {family} encoder without a language-model head"
    if experiment == "attn" and family == "gpt_oss":
        return "its learned sink logit per head takes attention mass that no key holds"
    if experiment == "pe recover" and kind != "learned":
        return f"not applicable: {kind} positions are .+, not added to the token embedding"
    return None


@pytest.fixture
def inputs(tmp_path):
    texts = tmp_path / "texts.csv"
    pd.DataFrame({"text": TEXTS}).to_csv(texts, index=False)
    items = tmp_path / "items.jsonl"
    items.write_text("\n".join(json.dumps(item) for item in ITEMS) + "\n")
    return {"texts": texts, "items": items}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("experiment", list(EXPERIMENTS))
def test_each_experiment_works_or_says_not_applicable(experiment, family, inputs, tiny, monkeypatch,
                                                      tmp_path, invoke):
    loaded = []

    def load_tiny(name, **kwargs):
        loaded.append(name)
        return tiny(name.removeprefix("random:"))

    monkeypatch.setattr("pecli.models.loading.load_model", load_tiny)
    command, options, files = EXPERIMENTS[experiment]
    dataset = [] if experiment == "passkey" else [
        "--dataset", str(inputs["items" if experiment == "mc" else "texts"])]
    out = tmp_path / "out"
    result = invoke(*command, f"random:{family}", *options, *dataset, "--device", "cpu",
                    "--out", str(out))
    refusal = expected_refusal(experiment, family)
    if experiment == "passkey" and refusal is None:
        # the tiny configs' 64 positions hold no passkey template with its answer (61 + 10
        # tokens): every run is refused in one line once the tokenizer has measured the template
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert result.exit_code == 1 and len(lines) == 1, result.output
        assert lines[0].startswith("error: --lengths 48: no passkey trial fits"), lines[0]
        return
    if refusal is None:
        assert result.exit_code == 0, result.output
        for name in files:
            assert (out / name).exists(), f"{experiment} on {family} wrote no {name}"
    else:
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert result.exit_code != 0 and len(lines) == 1, result.output
        assert re.search(refusal, lines[0]), lines[0]
        assert not loaded, f"{experiment} on {family} loaded weights before refusing"
