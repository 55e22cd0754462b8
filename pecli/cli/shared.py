"""What every command shares: a wide console for piped output, and the one writer of a command's results."""

from rich.console import Console


def console(**kwargs) -> Console:
    """A Rich console; piped or captured output gets 150 columns, not a squeezed 80."""
    out = Console(**kwargs)
    if not out.is_terminal:
        out.width = 150
    return out


def run_and_write(experiment: str, run, options, out, *, save_dir: bool = False,
                  notes: dict | None = None, **kwargs):
    """`run(options, **kwargs)` of a registered experiment, then its tables and figures
    (figures/ under the output folder) written through pecli.runs.io.RunOutput, with the
    options (`as_dict`) in every sidecar: the one writer of a command's results.

    save_dir: the run also writes files of its own (checkpoints) into `options.save_dir`;
    they are staged as OUT/models with the tables and recorded at their final place.
    notes: more for the sidecars (e.g. how intervals were computed).
    Returns (frames, table paths, figure paths, the options as recorded); a worker process
    of a parallel launch writes nothing and gets ({}, {}, [], options).
    """
    from pecli.experiments import load_all
    from pecli.runs import parallel
    from pecli.runs.io import RunOutput, default_out_dir

    exp = load_all().get(experiment)
    with RunOutput(out or default_out_dir(experiment)) as output:  # --out checked before computing
        recorded = options
        if save_dir:
            recorded = options.replace(save_dir=str(output.target / "models"))
            options = options.replace(save_dir=str(output.dir / "models"))
        frames = run(options, **kwargs)
        if not parallel.is_main():  # launched on N processes: the main one writes
            return {}, {}, [], recorded
        config = {"experiment": experiment, "version": exp.version, **recorded.as_dict(),
                  **(notes or {})}
        tables, figures = output.write(frames, config, exp.figures)
    return frames, tables, figures, recorded
