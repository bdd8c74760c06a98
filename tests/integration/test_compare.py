"""`mini-gpt compare` on run folders written here (summary.json + .hydra/), and the scaling fit on losses
made from a known curve."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from PIL import Image

from mini_gpt.cli.compare import main
from mini_gpt.errors import MiniGPTError
from mini_gpt.viz.compare import compare_table, curves_figure, find_runs, scaling_fit


def _run(folder: Path, overrides: list[str], config: dict[str, Any], **summary: Any) -> Path:
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    steps = summary.get("steps", 10)
    full = {"status": "completed", "steps": steps, "tokens": steps * 100, "flops": steps * 1e6,
            "wall_seconds": 5.0, "tokens_per_sec": 200.0, "best_val_loss": None, "final_val_loss": None,
            "val_curve": [[5, 2.0, 3.0], [10, 4.0, 2.5]], "eval": {}, **summary}  # fmt: skip
    (folder / "summary.json").write_text(json.dumps(full))
    return folder


def _config(lr: float, n_embd: int = 32, data: str = "shakespeare_char") -> dict[str, Any]:
    return {"seed": 1, "optim": {"lr": lr, "name": "adamw"}, "model": {"n_embd": n_embd},
            "data": {"name": data}, "paths": {"run_dir": "/somewhere"}}  # fmt: skip


@pytest.fixture
def multirun(tmp_path: Path) -> Path:
    root = tmp_path / "multirun"
    _run(root / "0", ["optim.lr=0.001"], _config(0.001), best_val_loss=2.5, final_val_loss=2.6)
    _run(root / "1", ["optim.lr=0.01"], _config(0.01), best_val_loss=2.1, status="preempted")
    _run(root / "2", ["optim.lr=0.1"], _config(0.1), best_val_loss=None, status="diverged", steps=3)
    return root


def test_compare_writes_one_sorted_row_per_run(multirun: Path, capsys: pytest.CaptureFixture) -> None:
    assert main([str(multirun)]) == 0
    out = capsys.readouterr().out
    with (multirun / "compare.csv").open() as f:
        rows = list(csv.DictReader(f))
    # only the differing config value is a column; sorted by best val loss, the best marked, any status
    assert [row["optim.lr"] for row in rows] == ["0.01", "0.001", "0.1"]
    assert [row["best"] for row in rows] == ["*", "", ""]
    assert [row["status"] for row in rows] == ["preempted", "completed", "diverged"]
    assert [row["best_val_loss"] for row in rows] == ["2.1000", "2.5000", "-"]
    assert rows[0]["tokens"] == "1000" and rows[0]["flops"] == "1e+07" and rows[2]["steps"] == "3"
    assert "seed" not in rows[0] and "paths.run_dir" not in rows[0]
    assert out.splitlines()[0].startswith("| best | optim.lr | status | best_val_loss |")
    html = (multirun / "compare.html").read_text()
    assert html.count("<tr>") == 4 and "data:image/png;base64," in html
    with Image.open(multirun / "compare.png") as image:
        assert image.size[0] > 800  # the 2 x 2 grid of curves


def test_chart_legend_is_short_and_outside_the_panels(tmp_path: Path) -> None:
    """A sweep's float overrides are named as the table shows them (4 significant digits), in a legend
    that covers no panel, tick or axis label and stays inside the figure."""
    _run(tmp_path / "a", ["optim.lr=0.006332296532502845"], _config(0.006332296532502845), best_val_loss=2.2)
    _run(tmp_path / "b", ["optim.lr=0.0001234567890123"], _config(0.0001234567890123), best_val_loss=2.4)
    _, _, runs, keys = compare_table(find_runs([str(tmp_path)]))
    fig = curves_figure(runs, keys)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["optim.lr=0.006332", "optim.lr=0.0001235"]
    box = legend.get_window_extent(renderer)
    assert fig.bbox.contains(box.x0, box.y0) and fig.bbox.contains(box.x1, box.y1)
    for ax in fig.axes:
        assert ax.get_legend() is None and not box.overlaps(ax.get_tightbbox(renderer))
    fig.savefig(tmp_path / "compare.png")


def test_bad_compares_are_one_line(tmp_path: Path, multirun: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path / "empty")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.startswith(f"error: {tmp_path / 'empty'} does not exist")
    (tmp_path / "nothing").mkdir()
    with pytest.raises(MiniGPTError, match=r"no runs in .*nothing: a run folder has a summary.json"):
        find_runs([str(tmp_path / "nothing")])
    _run(tmp_path / "bpe", ["data=shakespeare"], _config(0.001, data="shakespeare"), best_val_loss=5.0)
    with pytest.raises(SystemExit):
        main([str(multirun / "0"), str(tmp_path / "bpe"), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert err.startswith("error: these runs differ in data.name: their val losses are on different data")
    assert len(err.strip().splitlines()) == 1


def test_scaling_fit_finds_the_valley_of_each_budget(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Losses on exact parabolas in log10(N) with the valley at N = 1e4 x (C / 1e12)^0.5: the fit must
    return those optima and the exponent 0.5."""
    for budget in (1e12, 4e12, 16e12):
        n_opt = 1e4 * (budget / 1e12) ** 0.5
        for k, n in enumerate(n_opt * 10 ** (0.5 * i) for i in (-2, -1, 0, 1, 2)):
            loss = 2.0 + 0.3 * (math.log10(n) - math.log10(n_opt)) ** 2 - 0.1 * math.log10(budget / 1e12)
            config = {"trainer": {"max_flops": budget}, "model": {"n_embd": k}}
            _run(tmp_path / f"{budget:g}-{k}", [], config, final_val_loss=loss, best_val_loss=loss,
                 non_embedding_params=n, params=n + 1000)  # fmt: skip
    fit = scaling_fit(find_runs([str(tmp_path)]))
    assert fit.params_key == "non_embedding_params"
    for budget, n_opt, _ in fit.minima:
        assert n_opt == pytest.approx(1e4 * (budget / 1e12) ** 0.5, rel=1e-6)
    assert fit.exponent == pytest.approx(0.5, abs=1e-6)
    assert fit.coefficient == pytest.approx(1e4 / 1e12**0.5, rel=1e-4)
    assert main([str(tmp_path), "--scaling", "--out", str(tmp_path / "report")]) == 0  # the old flags
    assert (tmp_path / "report" / "scaling.png").stat().st_size > 10_000
    assert main([f"runs=[{tmp_path}]", "scaling=true", "params=total", f"out={tmp_path / 'total'}"]) == 0
    assert "isoFLOP optima (params):" in capsys.readouterr().out
    assert (tmp_path / "total" / "scaling.png").stat().st_size > 10_000


def test_runs_key_and_folders_as_arguments_are_the_same_runs(multirun: Path, tmp_path: Path) -> None:
    """`runs=[...]` (a Hydra list) and folders given as arguments (verbatim) name the same runs."""
    assert main([f"runs=[{multirun / '0'},{multirun / '1'}]", f"out={tmp_path / 'a'}"]) == 0
    assert main([str(multirun / "0"), "--out", str(tmp_path / "b"), str(multirun / "1")]) == 0
    table = (tmp_path / "a" / "compare.csv").read_text()
    assert table == (tmp_path / "b" / "compare.csv").read_text() and len(table.splitlines()) == 3


def test_scaling_needs_budget_runs(multirun: Path) -> None:
    with pytest.raises(MiniGPTError, match=r"scaling=true needs runs trained to a compute budget"):
        scaling_fit(find_runs([str(multirun)]))


def test_seeds_print_their_mean_and_spread(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    finals = {(0.01, 3): 1.49, (0.01, 1): 1.50, (0.01, 2): 1.52, (0.1, 1): 1.61, (0.1, 2): 1.65}
    for i, ((lr, seed), final) in enumerate(finals.items()):
        config = {**_config(lr), "seed": seed}
        _run(tmp_path / "m" / str(i), [f"optim.lr={lr}", f"seed={seed}"], config, best_val_loss=final,
             final_val_loss=final, wall_seconds=500.0 + i)  # fmt: skip
    lone = {**_config(0.3), "seed": 1}  # one seed only: no spread to report
    _run(tmp_path / "m" / "5", ["optim.lr=0.3", "seed=1"], lone, best_val_loss=1.4, final_val_loss=1.4)
    diverged = {**_config(0.01), "seed": 4}  # not completed: out of the means
    _run(tmp_path / "m" / "6", ["optim.lr=0.01", "seed=4"], diverged, final_val_loss=9.0, status="diverged")
    assert main([str(tmp_path / "m")]) == 0
    out = capsys.readouterr().out
    seeds_part = out.split("over seeds")[1]
    rows = [line.split(" | ") for line in seeds_part.splitlines() if line.startswith("| optim.lr")]
    assert [r[0] for r in rows] == ["| optim.lr=0.01", "| optim.lr=0.1"]
    values = [1.50, 1.52, 1.49]  # seeds 1, 2, 3
    mean = sum(values) / 3
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / 2)
    assert rows[0][1:5] == ["1,2,3", f"{mean:.4f}", f"{std:.4f}", "1.5000, 1.5200, 1.4900"]
    assert rows[0][5].rstrip(" |") == "502.0"  # the slowest seed (seed 2, the third run written)
    assert rows[1][1:4] == ["1,2", "1.6300", f"{math.sqrt(2 * 0.02**2):.4f}"]


def test_no_seed_table_when_seeds_do_not_differ(multirun: Path, capsys: pytest.CaptureFixture) -> None:
    assert main([str(multirun)]) == 0
    assert "over seeds" not in capsys.readouterr().out


def test_a_run_without_config_is_skipped_in_one_line(
    multirun: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A multirun trial killed before Hydra wrote `.hydra/` has a summary.json and nothing that says what it
    trained: the others compare, one stderr line names it; with no config anywhere, one `error:` line."""
    killed = multirun / "3"
    killed.mkdir()
    (killed / "summary.json").write_text(json.dumps({"status": "interrupted", "steps": 1}))
    assert main([str(multirun)]) == 0
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        f"skipped {killed}: no .hydra/config.yaml (killed before Hydra wrote it)"
    ]
    assert captured.out.splitlines()[0].startswith("| best | optim.lr | status |")
    assert len((multirun / "compare.csv").read_text().splitlines()) == 4  # the header and runs 0, 1, 2
    with pytest.raises(SystemExit) as exit_info:
        main([str(killed), "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: {killed}: no .hydra/config.yaml (killed before Hydra wrote it), so nothing says what was "
        "trained; pass folders of runs that started"
    ]


def test_columns_are_the_resolved_keys_that_change_training(tmp_path: Path) -> None:
    """Columns: the differing keys under model, optim, trainer, loader, data and seed, with `${...}` resolved
    as the run did (`${project_root:}` is the checkout); loggers and callbacks are no columns; an
    interpolation that cannot resolve here shows as written."""

    def config(steps: int, tokenizer: str, muon_lr: Any, logger: dict[str, Any]) -> dict[str, Any]:
        tokenizer = "${paths.root_dir}/data/tokenizers/" + tokenizer
        return {"seed": 1, "model": {"n_embd": 32}, "trainer": {"max_steps": steps},
                "optim": {"name": "muon", "decay_steps": "${trainer.max_steps}", "muon_lr": muon_lr},
                "data": {"name": "shakespeare", "tokenizer": tokenizer},
                "paths": {"root_dir": "${project_root:}", "run_dir": "${hydra:runtime.output_dir}"},
                "logger": logger,
                "callbacks": {"sample_text": None if steps == 100 else {"every": 5}}}  # fmt: skip

    bpb = {"eval": {"eval/bpb/bits_per_byte": 1.2}}  # on different tokenizers: compared by bits per byte
    wandb = {"wandb": {"project": "mini-gpt", "save_dir": "${paths.run_dir}"}}
    csv_log = {"csv": {"name": "csv", "save_dir": "${paths.run_dir}"}}
    _run(tmp_path / "a", [], config(100, "bpe_2k", "${nope.lr}", wandb), best_val_loss=2.0, **bpb)
    _run(tmp_path / "b", [], config(200, "bpe_4k", 0.02, csv_log), best_val_loss=2.5, **bpb)
    header, rows, _, _ = compare_table(find_runs([str(tmp_path)]))
    keys = header[1 : header.index("status")]
    assert keys == ["data.tokenizer", "optim.decay_steps", "optim.muon_lr", "trainer.max_steps"]
    root = Path(__file__).resolve().parents[2]  # the checkout: project_root's value in a source checkout
    assert [row[1:5] for row in rows] == [
        [f"{root}/data/tokenizers/bpe_2k", "100", "${nope.lr}", "100"],
        [f"{root}/data/tokenizers/bpe_4k", "200", "0.02", "200"],
    ]


def test_seeds_group_across_logger_settings(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Two seeds of one recipe, logged differently (W&B in one, CSV in the other): one recipe, one row."""
    for seed, final, logger in ((1, 1.50, {"wandb": {"project": "x"}}), (2, 1.52, {"csv": {"name": "csv"}})):
        config = {**_config(0.01), "seed": seed, "logger": logger}
        _run(tmp_path / str(seed), [f"seed={seed}"], config, best_val_loss=final, final_val_loss=final)
    assert main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "over seeds" in out
    assert [line for line in out.split("over seeds")[1].splitlines() if line.startswith("| -")] == [
        "| - | 1,2 | 1.5100 | 0.0141 | 1.5000, 1.5200 | 5.0 |"
    ]
