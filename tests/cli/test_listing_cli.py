from typer.testing import CliRunner

from pecli.cli.app import app

runner = CliRunner()


def test_help_lists_commands():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("models", "datasets", "reproduce"):
        assert command in result.output


def test_models_shows_offline_models():
    result = runner.invoke(app, ["models"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "minilm" in result.output and "smollm2" in result.output and "random:gpt2" in result.output


def test_models_lists_every_family_with_its_positions_and_interventions():
    from pecli.models.architectures import ARCHITECTURES

    result = runner.invoke(app, ["models"], env={"COLUMNS": "250"})
    assert result.exit_code == 0
    families = result.output[result.output.index("families:"):]
    rows = {line.split("│")[1].strip(): line for line in families.splitlines() if line.count("│") > 4}
    for family, spec in ARCHITECTURES.items():
        assert f"random:{family}" in result.output
        assert spec.position in rows[family] and spec.reference in rows[family]
    assert "reverse" in rows["bloom"] and "shift" not in rows["bloom"]
    assert "shuffle" in rows["t5"] and "reverse" not in rows["t5"]


def test_datasets_and_bad_dir(tmp_path):
    result = runner.invoke(app, ["datasets", "--data-dir", str(tmp_path)], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "lacks" in result.output
    result = runner.invoke(app, ["datasets", "--data-dir", str(tmp_path / "nope")])
    assert result.exit_code == 1
    assert result.output.strip().startswith("error: data directory") and "Traceback" not in result.output


def test_ctrl_c_exits_130_and_says_what_was_kept(monkeypatch):
    import pecli.experiments.ablate as ablate_exp
    import pecli.experiments.pe as pe_exp
    import pecli.experiments.perplexity as perplexity_exp
    import pecli.experiments.reproduce as reproduce_mod

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(ablate_exp, "run", interrupted)
    monkeypatch.setattr(perplexity_exp, "run", interrupted)
    monkeypatch.setattr(pe_exp, "run_probe", interrupted)
    monkeypatch.setattr(reproduce_mod, "run_preset", interrupted)
    for command in ("ablate", "perplexity"):  # before any checkpoint: no resume is promised
        result = runner.invoke(app, [command, "minilm"])
        assert result.exit_code == 130 and "no progress had been saved yet" in result.output
    result = runner.invoke(app, ["pe", "probe", "minilm"])
    assert result.exit_code == 130 and "interrupted: nothing was written" in result.output
    result = runner.invoke(app, ["reproduce", "--preset", "smoke"])
    assert result.exit_code == 130 and "rerun the same command to resume" in result.output


def test_cache_lists_models_and_interrupted_runs_and_clears_them(tmp_path, monkeypatch):
    monkeypatch.setenv("PECLI_CACHE_DIR", str(tmp_path))
    (tmp_path / "models" / "SomeModel-abc").mkdir(parents=True)
    (tmp_path / "models" / "SomeModel-abc" / "model.safetensors").write_bytes(b"x" * 2_000_000)
    (tmp_path / "partial").mkdir()
    (tmp_path / "partial" / "ablate-0123.npz").write_bytes(b"y" * 1000)
    result = runner.invoke(app, ["cache"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "SomeModel-abc" in result.output and "2.0 MB" in result.output
    assert "ablate-0123.npz" in result.output and "resumes" in result.output
    result = runner.invoke(app, ["cache", "--clear-partial"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "deleted 1 saved run(s)" in result.output
    assert not list((tmp_path / "partial").glob("*.npz"))
    assert (tmp_path / "models" / "SomeModel-abc" / "model.safetensors").exists()
