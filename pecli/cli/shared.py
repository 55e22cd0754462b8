"""What every command shares: a wide console for piped output, and the one writer of a command's results."""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console


def console(**kwargs) -> Console:
    """A Rich console; piped or captured output gets 150 columns, not a squeezed 80."""
    out = Console(**kwargs)
    if not out.is_terminal:
        out.width = 150
    return out


def run_and_write(experiment: str, run, options, out, *, save_dir: bool | str = False,
                  notes: dict | None = None, force: bool = False, **kwargs):
    """`run(options, **kwargs)` of a registered experiment, then its tables and figures
    (figures/ under the output folder) written through pecli.runs.io.RunOutput, with the
    options (`as_dict`) in every sidecar: the one writer of a command's results.

    The output folder is held for the run's lifetime; one that holds another command's or
    configuration's results is refused before computing, unless `force` (--force).
    save_dir: the run also writes files of its own (checkpoints) into `options.save_dir`;
    they are staged as OUT/models (or OUT/<save_dir>, given a name) with the tables and
    recorded at their final place.
    notes: more for the sidecars (e.g. how intervals were computed).
    Returns (frames, table paths, figure paths, the options as recorded); a worker process
    of a parallel launch writes nothing and gets ({}, {}, [], options).
    """
    from pecli.experiments import load_all
    from pecli.runs import parallel
    from pecli.runs.io import RunOutput, default_out_dir

    exp = load_all().get(experiment)
    _check_model_out(getattr(options, "model_out", None), force)
    target = Path(out or default_out_dir(experiment)).expanduser()
    folder = save_dir if isinstance(save_dir, str) else "models"
    recorded = options.replace(save_dir=str(target / folder)) if save_dir else options
    config = {"experiment": experiment, "version": exp.version, **recorded.as_dict(), **(notes or {})}
    if note := parallel.launch_note():
        console(stderr=True).print(f"note: {note}", style="yellow", soft_wrap=True)
    with RunOutput(target, config, force=force) as output:  # --out checked before computing
        if save_dir:
            options = options.replace(save_dir=str(output.dir / folder))
        frames = run(options, **kwargs)
        if not parallel.is_main():  # launched on N processes: the main one writes
            return {}, {}, [], recorded
        if parallel.launched():  # the header: who computed what
            shares = "/".join(str(parallel.SHARES.get(k, 0)) for k in range(parallel.world_size()))
            console(stderr=True).print(f"computed by {parallel.world_size()} processes (padded tokens per "
                          f"process: {shares}; also in every row: world_size, process_tokens)",
                          soft_wrap=True)
        tables, figures = output.write(frames, config, exp.figures, companions=exp.companions)
    return frames, tables, figures, recorded


def _check_model_out(model_out, force: bool) -> None:
    """--model-out over a checkpoint an earlier run wrote (its config.json, here or a level
    down) is refused unless --force: that run's recorded revision would name weights gone."""
    if model_out is None or force:
        return
    folder = Path(model_out).expanduser()
    found = [p for p in (folder / "config.json", *folder.glob("*/config.json")) if p.is_file()]
    if found:
        from pecli.runs.errors import OutputError

        raise OutputError(f"--model-out {model_out}: {found[0].parent} already holds a checkpoint; "
                          "give another folder, or --force to replace it")


@contextmanager
def counter(label: str, unit: str) -> Iterator[Callable[[int, int], None]]:
    """A progress bar of `unit`s (plain lines when piped, none on a worker process of a
    parallel launch), advanced by the `progress(n, total)` callback it yields to a run."""
    from rich.progress import BarColumn, MofNCompleteColumn, TimeElapsedColumn

    from pecli.runs import parallel
    from pecli.runs.progress import progress_bar

    with progress_bar(label, BarColumn(), MofNCompleteColumn(), unit, TimeElapsedColumn(),
                      transient=True, disable=not parallel.is_main()) as bar:
        task = bar.add_task(label, total=None)
        yield lambda n, total: bar.update(task, advance=n, total=total)


def ci_text(row, fmt: str | Callable[[float], str] = ".4f") -> str:
    """` [low, high]`: a row's 95 % interval for printing; ` (no interval)` where it is NaN
    (fewer than 2 texts, or --bootstrap 0)."""
    low, high = row.get("ci_low"), row.get("ci_high")
    if low is None or low != low:
        return " (no interval)"
    form = fmt if callable(fmt) else (lambda x: format(x, fmt))
    return f" [{form(low)}, {form(high)}]"


def short_method(method) -> str:
    """An interval method in a few words: '95 % percentile bootstrap over texts (...)' -> 'bootstrap over texts'."""
    text = str(method or "") if method == method else ""
    if not text:
        return ""
    text = text.split(" (")[0].split(";")[0].replace("95 % ", "").replace("percentile ", "")
    return text.replace(" score interval", "")
