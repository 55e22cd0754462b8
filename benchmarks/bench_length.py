"""Speed of `pecli length`, in one run, against named baselines on the same tokens.

    python benchmarks/bench_length.py            # row 1 at L=512 on 4096 tokens; row 3 at L=8192
    python benchmarks/bench_length.py --more-layers   # row 2 too (the four-layer loop: minutes)
    python benchmarks/bench_length.py --quick    # L=128 on 1024 tokens; row 3 at L=1024

1. The band pass (one band-masked pass over the stream, `--windows band`) against the
   per-window loop it replaces (`--windows sliding --stride 1`: one window of L tokens per
   scored token, batched), at L=512 on a 4096-token stream, on a one-layer rotary model of
   pecli's training size: there the two are the same computation (max NLL difference
   printed). With more layers they differ (row 2, --more-layers, prints by how much): the band pass is then
   sliding-window attention, a different measure (docs/length.md).
2. The same pair on a four-layer model: the time ratio, and the NLL difference that shows
   the two measure different things.
3. `pecli length` (experiments.length.run: nonoverlapping windows, scoring, position
   buckets, bootstrap) at L=8192 on SmolLM2 against a plain transformers forward
   (`model(input_ids)`, full logits) over the same windows.
The attention mask each layer receives is recorded and printed: the band pass passes one
boolean [1, 1, n, n] tensor, shared by every layer (SDPA reads it as it is); the per-window
and plain passes pass none (SDPA's causal kernel).
Every pair is timed in this run, the reference first, after a warm-up; the per-window loop
once (it is the slow side), the band pass best of 3.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
from timing import best_of, load_average

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


VOCAB = 4096  # `pecli train lm`'s BPE (its default --vocab)


def tiny_rope(layers: int, positions: int):
    """A random rotary LM of `pecli train lm`'s size: width 128, 4 heads, a 4096-entry vocabulary
    (GPT-2's tokenizer object for its special tokens; the benchmark's token ids stay below 4096).
    With GPT-2's 50,257 rows the output layer would be most of either side's time, and the
    ratio a measure of the output layer, which both sides apply to every scored token."""
    from pecli.measures.training import ModelSize, build_model
    from pecli.models.architectures import ARCHITECTURES
    from pecli.models.loading import LoadedModel
    from pecli.models.sources import package_dir
    from pecli.models.tokenizers import (
        GPT2_TOKENIZER_PACKAGE,
        gpt2_tokenizer_from,
        prepare_tokenizer,
    )

    tok = gpt2_tokenizer_from(package_dir(GPT2_TOKENIZER_PACKAGE))
    prepare_tokenizer(tok)
    tok.pad_token = tok.bos_token = tok.eos_token = tok.convert_ids_to_tokens(0)  # an id below VOCAB
    model = build_model("rope", VOCAB, ModelSize(layers, 128, 4, positions), pad_token_id=0,
                        bos_token_id=0, eos_token_id=0).eval()
    return LoadedModel(model, tok, ARCHITECTURES.get("llama"), f"rope-{layers}L", "random", "random",
                       "seed:0", torch.device("cpu"), torch.float32)


class MaskLog:
    """The attention_mask each attention layer is called with (kind, shape, distinct tensors)."""

    def __init__(self, model):
        self.seen, self.handles = [], []
        for module in model.modules():
            if type(module).__name__.endswith("Attention"):
                self.handles.append(module.register_forward_pre_hook(self._hook, with_kwargs=True))

    def _hook(self, module, args, kwargs):
        self.seen.append(kwargs.get("attention_mask"))

    def summary(self) -> str:
        for h in self.handles:
            h.remove()
        masks = [m for m in self.seen if m is not None]
        if not masks:
            return f"no mask in any of {len(self.seen)} layer calls (SDPA's causal kernel)"
        distinct = {id(m): m for m in masks}
        shapes = sorted({(str(m.dtype).removeprefix("torch."), tuple(m.shape)) for m in distinct.values()})
        return (f"{len(distinct)} distinct mask tensor(s) over {len(masks)} layer calls "
                f"({', '.join(f'{d} {list(s)}' for d, s in shapes)})")


def band_row(layers: int, length: int, tokens: int, reps: int) -> None:
    from pecli.measures.length_scoring import cut, score_band
    from pecli.measures.lm_scoring import score_windows

    loaded = tiny_rope(layers, length)
    stream = torch.randint(5, VOCAB, (tokens,), generator=torch.Generator().manual_seed(0)).tolist()
    windows = cut(stream, length, "band")
    score_band(loaded, stream, windows)  # warm-up
    log = MaskLog(loaded.model)
    with torch.inference_mode():
        loop, t_loop = best_of(lambda: torch.cat(score_windows(loaded, windows.windows(stream))), 1)
    loop_masks = log.summary()
    log = MaskLog(loaded.model)
    band, t_band = best_of(lambda: torch.cat(score_band(loaded, stream, windows)), max(reps, 3))
    band_masks = log.summary()
    diff = (band - loop).abs().max().item()
    print(f"{layers}-layer rotary, L={length}, {tokens} tokens ({len(windows)} windows, "
          f"{windows.tokens} scored): per-window loop {t_loop:.2f} s, band pass {t_band:.3f} s -> "
          f"{t_loop / t_band:.1f}x; max NLL diff {diff:.1e} "
          f"({'the same numbers' if diff < 1e-4 else 'different measures: sliding-window attention'}); "
          f"load {load_average()}")
    print(f"   masks: per-window loop: {loop_masks}; band pass: {band_masks}")


def length_row(length: int, reps: int) -> None:
    import pandas as pd

    from pecli.data.datasets import load_data
    from pecli.experiments.length import run, stream_of
    from pecli.experiments.options.length import LengthOptions
    from pecli.measures.length_scoring import cut
    from pecli.models.loading import load_model

    loaded = load_model("smollm2", device="cpu")
    data = load_data("imdb", data_dir_=os.environ.get("PECLI_DATA_DIR"), limit=80, seed=0)
    texts = data.frame.sort_values("text_id")["text"].tolist()
    stream = stream_of(loaded.tokenizer, texts)
    n_windows = 1
    docs = Path("/tmp") / "bench_length_docs.csv"
    # just enough documents for n_windows full windows
    kept, total = [], 0
    for text in texts:
        kept.append(text)
        total = len(stream_of(loaded.tokenizer, kept))
        if total >= n_windows * length:
            break
    pd.DataFrame({"text": kept}).to_csv(docs, index=False)
    stream = stream_of(loaded.tokenizer, kept)
    windows = cut(stream, length)
    options = LengthOptions.build({"model": "smollm2", "dataset": str(docs), "lengths": [length],
                                   "buckets": 8}, "bench")

    def plain():
        with torch.inference_mode():
            return [loaded.model(torch.tensor([w.ids])).logits[0, -1, 0].item() for w in windows.windows(stream)]

    plain()  # warm-up (pages the weights in)
    log = MaskLog(loaded.model)
    _, t_plain = best_of(plain, reps)
    plain_masks = log.summary()
    log = MaskLog(loaded.model)
    table, t_pecli = best_of(lambda: run(options, loaded=loaded)["length"], reps)
    pecli_masks = log.summary()
    whole = table[table["all_positions"]].iloc[0]
    print(f"SmolLM2, pecli length at L={length} ({len(windows)} window, {whole['tokens']} scored tokens, "
          f"perplexity {whole['perplexity']:.2f}, 8 buckets + bootstrap): {t_pecli:.1f} s; plain "
          f"transformers forward over the same window(s): {t_plain:.1f} s -> {t_pecli / t_plain:.2f}x "
          f"the plain forward; load {load_average()}")
    print(f"   masks: plain forward: {plain_masks}; pecli length: {pecli_masks}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--skip-smollm2", action="store_true")
    parser.add_argument("--more-layers", action="store_true",
                        help="also row 2, the four-layer pair (the loop alone takes minutes)")
    args = parser.parse_args()
    torch.manual_seed(0)
    length, tokens, long = (128, 1024, 1024) if args.quick else (512, 4096, 8192)
    print(f"bench_length: torch {torch.__version__}, {torch.get_num_threads()} threads, load {load_average()}")
    band_row(1, length, tokens, args.reps)
    if args.more_layers:
        band_row(4, length, tokens, args.reps)
    if not args.skip_smollm2:
        length_row(long, args.reps)


if __name__ == "__main__":
    main()
