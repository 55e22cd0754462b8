"""Results files are whole or absent; long tables are gzipped and read back unchanged."""

from pathlib import Path

import pandas as pd
import pytest

from pecli.runs.io import GZIP_ROWS, write_csv, write_table


def test_long_tables_are_gzipped_and_round_trip(tmp_path):
    small = pd.DataFrame({"metric": ["a", "b"], "value": [1.5, 2.5]})
    large = pd.DataFrame({"metric": ["x"] * (GZIP_ROWS + 1), "value": range(GZIP_ROWS + 1)})
    assert write_table(small, tmp_path, "small", {}).name == "small.csv"
    path = write_table(large, tmp_path, "large", {})
    assert path.name == "large.csv.gz" and (tmp_path / "large.json").exists()
    assert path.read_bytes()[:2] == b"\x1f\x8b"  # gzip magic
    pd.testing.assert_frame_equal(pd.read_csv(path), large)
    # deterministic bytes: the same table gives the same file
    first = path.read_bytes()
    write_table(large, tmp_path, "large", {})
    assert path.read_bytes() == first


def test_failed_write_leaves_nothing(tmp_path):
    class Boom(pd.DataFrame):
        def to_csv(self, *args, **kwargs):
            raise KeyboardInterrupt

    for name in ("t.csv", "t.csv.gz"):
        with pytest.raises(KeyboardInterrupt):
            write_csv(Boom({"a": [1]}), tmp_path / name)
    assert list(tmp_path.iterdir()) == []


def test_checkpoint_saves_when_due_never_too_often_and_by_key(tmp_path, monkeypatch):
    import numpy as np

    from pecli.runs.io import Checkpoint

    monkeypatch.setenv("PECLI_CACHE_DIR", str(tmp_path))
    now, built = [0.0], []
    cp = Checkpoint("t", {"a": 1}, ["x"], every=60)
    cp._clock, cp._last = (lambda: now[0]), 0.0

    def arrays():
        built.append(now[0])
        return {"x": np.arange(3)}

    now[0] = 30
    cp.save(arrays)
    assert built == [] and cp.load() is None  # not due: nothing built, nothing written
    now[0] = 61
    cp.save(arrays)
    np.testing.assert_array_equal(cp.load()["x"], np.arange(3))
    cp._cost = 10.0  # a save that took 10 s waits 20 x 10 s, not 60 s
    now[0] = 61 + 100
    cp.save(arrays)
    now[0] = 61 + 201
    cp.save(arrays)
    assert built == [61, 262]
    assert Checkpoint("t", {"a": 2}, ["x"]).path != cp.path != Checkpoint("t", {"a": 1}, ["y"]).path
    assert Checkpoint("t", {"a": 1}, ["x"]).path == cp.path
    cp.clear()
    assert cp.load() is None and not list(tmp_path.glob("partial/*.tmp"))


def test_rows_and_sidecars_name_the_cpu_kernels_that_computed_them(tmp_path):
    """Training with one seed is bit-identical only under one kernel set (docs/training.md), so
    every row and sidecar says which: the one the process ran, lowered here to DEFAULT."""
    import json
    import os
    import subprocess
    import sys

    script = ("import sys, torch; from pathlib import Path; from pecli.runs.io import write_table; "
              "from pecli.runs.tables import frame; "
              "write_table(frame([{'metric': 'm', 'value': 1.0}], 'x', 0), Path(sys.argv[1]), 't', {})")
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default"}
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env, check=True)
    assert pd.read_csv(tmp_path / "t.csv")["cpu_kernels"].tolist() == ["DEFAULT"]
    assert json.loads((tmp_path / "t.json").read_text())["cpu_kernels"] == "DEFAULT"


def _finish_in_a_worker(name: str) -> str:
    """A job of run_jobs: save progress, then clear it as a finished run does."""
    import numpy as np

    from pecli.runs.io import Checkpoint

    cp = Checkpoint("t", {"job": name}, ["x"])
    cp.save(lambda: {"x": np.arange(3)}, force=True)
    assert cp.path.exists()
    cp.clear()
    return str(cp.path)


def test_a_forked_worker_clears_its_finished_progress_inside_the_parents_open_output(tmp_path, monkeypatch):
    """train-lm's workers (run_jobs: forked processes) run `pecli length` and `pecli
    perplexity` on their checkpoints inside the parent's open RunOutput. A fork inherits the
    list of open outputs but never closes them: clearing there was deferred to an output that
    never finished, and 25 progress files stayed in the cache after every train-lm run. A
    worker now deletes its own at once; in the process that opened the output, clearing
    still waits until the outputs are in place."""
    import numpy as np

    from pecli.measures.training import run_jobs
    from pecli.runs.io import Checkpoint, RunOutput

    monkeypatch.setenv("PECLI_CACHE_DIR", str(tmp_path / "cache"))
    frame = pd.DataFrame({"metric": ["m"], "value": [1.0]})
    with RunOutput(tmp_path / "out") as output:
        paths = run_jobs(_finish_in_a_worker, [("a",), ("b",)], workers=2)
        assert len(set(paths)) == 2 and not any(Path(p).exists() for p in paths)
        mine = Checkpoint("t", {"job": "parent"}, ["x"])
        mine.save(lambda: {"x": np.arange(3)}, force=True)
        mine.clear()
        assert mine.path.exists()  # the parent's: deferred until its outputs are written
        output.write({"t": frame}, {})
    assert not mine.path.exists()
    assert not list((tmp_path / "cache" / "partial").glob("*.npz"))
