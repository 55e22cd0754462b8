"""Results files are whole or absent; long tables are gzipped and read back unchanged."""

import pandas as pd
import pytest

from pecli.io import GZIP_ROWS, write_csv, write_table


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
