"""Loss/lr curves from a run directory's local files (written here by hand, not by the trainer)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import REPO

from mini_gpt.cli.plot import main, overrides_of
from mini_gpt.errors import MiniGPTError
from mini_gpt.viz.plot import (
    find_metrics,
    head_role_curves,
    plot_curves,
    plot_head_roles,
    plot_health,
    plot_run,
)

# What Lightning's CSVLogger writes for our module: one row per log call, blanks elsewhere.
CSV = """epoch,grad_norm,lr,step,train/loss,val/loss,val/ppl
0,1.5,0.0001,10,4.2,,
0,1.2,0.0002,20,3.1,,
0,,,20,,3.3,27.1
0,1.1,0.0003,30,2.5,,
0,,,40,,2.9,18.2
0,0.9,0.0003,40,2.2,,
"""


def write_run(root: Path, csv: str | None = CSV, val_curve: list | None = None) -> Path:
    run = root / "run"
    if csv is not None:
        (run / "csv").mkdir(parents=True)
        (run / "csv" / "metrics.csv").write_text(csv)
    if val_curve is not None:
        run.mkdir(parents=True, exist_ok=True)
        (run / "summary.json").write_text(json.dumps({"status": "completed", "val_curve": val_curve}))
    return run


def test_curves_from_csv(tmp_path: Path) -> None:
    run = write_run(tmp_path, val_curve=[[20, 1.0, 9.9]])  # the CSV's val curve takes precedence
    curves, used = find_metrics(run)
    assert curves == {
        "train_loss": {10: 4.2, 20: 3.1, 30: 2.5, 40: 2.2},
        "val_loss": {20: 3.3, 40: 2.9},
        "lr": {10: 1e-4, 20: 2e-4, 30: 3e-4, 40: 3e-4},
    }
    assert used == [run / "csv" / "metrics.csv"]
    fig, data = plot_curves(curves)
    lines = {line.get_label(): line for line in data["axes"][0].get_lines()}
    np.testing.assert_array_equal(lines["train"].get_xdata(), [10, 20, 30, 40])
    np.testing.assert_array_equal(lines["train"].get_ydata(), [4.2, 3.1, 2.5, 2.2])
    np.testing.assert_array_equal(lines["val"].get_ydata(), [3.3, 2.9])
    np.testing.assert_array_equal(data["axes"][1].get_lines()[0].get_ydata(), [1e-4, 2e-4, 3e-4, 3e-4])
    assert len(fig.axes) == 2


def test_val_curve_from_summary_json_only(tmp_path: Path) -> None:
    run = write_run(tmp_path, csv=None, val_curve=[[0, 0.5, 4.1], [100, 12.0, 2.0]])
    curves, _ = find_metrics(run)
    assert curves == {"val_loss": {0: 4.1, 100: 2.0}}
    fig, data = plot_curves(curves)
    assert len(fig.axes) == 1  # no lr panel without an lr series
    assert data["val_loss"] == ([0, 100], [4.1, 2.0])


def test_complete_summary_val_curve_wins(tmp_path: Path) -> None:
    run = write_run(tmp_path, val_curve=[[21, 1.0, 3.3], [41, 2.0, 2.9], [50, 3.0, 2.8]])
    curves, used = find_metrics(run)
    assert curves["val_loss"] == {21: 3.3, 41: 2.9, 50: 2.8}
    assert curves["train_loss"][40] == 2.2
    assert used == [run / "csv" / "metrics.csv", run / "summary.json"]


def test_merges_resumed_versions(tmp_path: Path) -> None:
    run = write_run(tmp_path)
    v1 = run / "csv" / "version_1"
    v1.mkdir()
    (v1 / "metrics.csv").write_text("lr,step,train/loss\n0.0003,40,2.0\n0.0003,50,1.9\n")
    os.utime(v1 / "metrics.csv", (2e9, 2e9))  # written after the first file
    curves, used = find_metrics(run)
    assert curves["train_loss"] == {10: 4.2, 20: 3.1, 30: 2.5, 40: 2.0, 50: 1.9}
    assert len(used) == 2


def test_writes_png_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = write_run(tmp_path)
    out = plot_run(run)
    assert out == run / "curves.png"
    assert out.read_bytes()[:4] == b"\x89PNG" and out.stat().st_size > 1000
    assert not (run / "health.png").exists()  # no health/ columns: no health page
    main([str(run), f"out={tmp_path / 'c.png'}", "dpi=50"])
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
    assert capsys.readouterr().out.splitlines()[-1] == f"wrote {tmp_path / 'c.png'}"
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "metrics.csv").write_text("epoch,step\n0,1\n")
    with pytest.raises(MiniGPTError, match="does not exist"):
        find_metrics(tmp_path / "nope")
    for argv, expected in [
        ([str(tmp_path / "empty")], "error: no metrics found under"),
        ([str(run), "colour=red"], "error: plot: unknown key 'colour'; the keys are run_dir, out, dpi"),
        (["out=x.png"], "error: RUN_DIR is required"),
        ([str(run), "dpi=high"], "error: dpi='high' must be an integer"),
    ]:
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(expected), (argv, err)
    (tmp_path / "lr=0.1").mkdir()  # an existing path with "=" is the run dir, not an override
    sweep_dir = str(tmp_path / "lr=0.1")
    assert overrides_of(["out=x.png", sweep_dir, "dpi=3"]) == ["out=x.png", f"run_dir={sweep_dir}", "dpi=3"]
    assert overrides_of(["a", "b"]) == ["run_dir=a", "b"]  # a second RUN_DIR is left for Hydra to refuse
    write_run(tmp_path / "lr=0.1,wd=0")  # verbatim: Hydra would read the comma as a sweep
    main([str(tmp_path / "lr=0.1,wd=0" / "run")])
    assert (tmp_path / "lr=0.1,wd=0" / "run" / "curves.png").is_file()


def test_head_roles_page_when_the_run_logged_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """callbacks.head_roles's columns (written by hand here) give a second page, head_roles.png: the loss
    above the best head's score per role; a run without them gets none (test_writes_png_and_errors)."""
    rows = (
        "step,train/loss,head_roles/induction_max,head_roles/previous_token_max,head_roles/induction/L1H0\n"
    )
    rows += "0,,0.01,0.02,0.01\n10,4.0,,,\n10,,0.05,0.40,0.05\n20,3.0,,,\n20,,0.60,0.45,0.60\n"
    run = write_run(tmp_path, csv=rows)
    out = plot_run(run)
    page = run / "head_roles.png"
    assert capsys.readouterr().out.splitlines()[-1] == f"wrote {page}"
    assert page.read_bytes()[:4] == b"\x89PNG" and out.read_bytes()[:4] == b"\x89PNG"
    curves, used = find_metrics(run)
    roles = head_role_curves(used)
    assert roles == {
        "induction": {0: 0.01, 10: 0.05, 20: 0.6},
        "previous_token": {0: 0.02, 10: 0.4, 20: 0.45},
    }
    _, data = plot_head_roles(curves, roles)
    loss, scores = data["axes"]
    assert [list(line.get_xdata()) for line in loss.get_lines()] == [[10, 20]]
    drawn = {
        line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in scores.get_lines()
    }
    assert drawn == {
        "induction": ([0, 10, 20], [0.01, 0.05, 0.6]),
        "previous-token": ([0, 10, 20], [0.02, 0.4, 0.45]),
    }
    assert loss.get_shared_x_axes().joined(loss, scores)  # the same steps


HEALTH_CSV = """epoch,health/attn_entropy/layer_0,health/grad_norm/block_0,health/grad_norm/block_10,\
health/grad_norm/block_2,health/grad_norm/embedding,health/grad_norm/head,health/rms/block_0,\
health/update_ratio/muon,lr,step,train/loss
0,3.2,0.5,0.7,0.6,1.5,0.1,0.03,0.01,0.001,10,4.2
0,3.0,0.4,0.6,0.5,1.2,0.2,0.05,0.008,0.001,20,3.1
"""


def test_health_page_has_a_panel_per_signal_and_a_line_per_layer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = write_run(tmp_path, csv=HEALTH_CSV)
    curves, _ = find_metrics(run)
    assert curves["health/grad_norm/block_10"] == {10: 0.7, 20: 0.6}
    fig, data = plot_health(curves)
    assert len(fig.axes) == 4
    titles = [ax.get_title() for ax in data["axes"]]
    assert [t.split(" ")[0] for t in titles] == ["gradient", "update", "block", "attention"]
    grad_norm = [line.get_label() for line in data["axes"][0].get_lines()]
    assert grad_norm == ["embedding", "block_0", "block_2", "block_10", "head"]  # layers by number
    np.testing.assert_array_equal(data["axes"][2].get_lines()[0].get_ydata(), [0.03, 0.05])
    assert data["axes"][0].get_yscale() == "log" and data["axes"][3].get_yscale() == "linear"

    plot_run(run)
    assert (run / "curves.png").is_file() and (run / "health.png").read_bytes()[:4] == b"\x89PNG"
    assert capsys.readouterr().out.splitlines()[-1] == f"wrote {run / 'curves.png'}, {run / 'health.png'}"
    main([str(run), f"out={tmp_path / 'c.png'}"])
    assert (tmp_path / "c_health.png").stat().st_size > 1000  # beside an `out` given, named after it


def test_cli(tmp_path: Path) -> None:
    run = write_run(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "mini_gpt.cli", "plot", str(run), f"out={tmp_path / 'p.png'}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_resumed_run_joins_the_runs_it_resumed_from(tmp_path: Path) -> None:
    """train.py ckpt_path=... writes a new run dir; the plot follows .hydra/config.yaml back to the first."""
    first = write_run(tmp_path / "a", val_curve=[[20, 1.0, 3.3], [40, 2.0, 2.9]])
    second = tmp_path / "b" / "run"
    third = tmp_path / "c" / "run"
    for run, previous, rows in (
        (second, first, "0.0003,50,2.0\n0.0002,60,1.8\n"),
        (third, second, "0.0001,70,1.7\n"),
    ):
        (run / "csv").mkdir(parents=True)
        (run / "csv" / "metrics.csv").write_text("lr,step,train/loss\n" + rows)
        (run / ".hydra").mkdir()
        (run / ".hydra" / "config.yaml").write_text(
            f"seed: 1337\nckpt_path: {previous / 'checkpoints' / 'last.ckpt'}\nmodel:\n  n_layer: 2\n"
        )
    (third / "summary.json").write_text(json.dumps({"val_curve": [[70, 1.0, 2.5]]}))
    curves, used = find_metrics(third)
    assert curves["train_loss"] == {10: 4.2, 20: 3.1, 30: 2.5, 40: 2.2, 50: 2.0, 60: 1.8, 70: 1.7}
    assert curves["val_loss"] == {20: 3.3, 40: 2.9, 70: 2.5}
    assert sorted(curves["resumed_at"]) == [50, 70]
    assert used[0] == first / "csv" / "metrics.csv"
    _, data = plot_curves(curves)
    assert data["train_loss"][0] == [10, 20, 30, 40, 50, 60, 70]
    assert data["resumed_at"] == [50, 70]
    marks = [line.get_xdata()[0] for line in data["axes"][0].get_lines() if line.get_linestyle() == ":"]
    assert marks == [50, 70]


def test_resume_mark_is_at_the_checkpoint_step_not_the_first_logged_one(tmp_path: Path) -> None:
    """Resumed at step 2 with train loss logged every 10 steps: the mark is at 2 (summary.json's
    start_step), not at 10, the segment's first logged step."""
    first = write_run(tmp_path / "a", csv="lr,step,train/loss\n0.0001,1,4.0\n")
    second = tmp_path / "b" / "run"
    (second / "csv").mkdir(parents=True)
    (second / "csv" / "metrics.csv").write_text("lr,step,train/loss\n0.0002,10,3.0\n0.0002,20,2.5\n")
    (second / ".hydra").mkdir()
    (second / ".hydra" / "config.yaml").write_text(f"ckpt_path: {first / 'checkpoints' / 'last.ckpt'}\n")
    (second / "summary.json").write_text(json.dumps({"start_step": 2, "val_curve": []}))
    curves, _ = find_metrics(second)
    assert sorted(curves["resumed_at"]) == [2]


def test_val_only_run_says_train_loss_was_not_logged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = write_run(tmp_path, csv=None, val_curve=[[0, 0.5, 4.1], [100, 12.0, 2.0]])  # logger=none
    _, data = plot_curves(find_metrics(run)[0])
    legend = [t.get_text() for t in data["axes"][0].get_legend().get_texts()]
    assert legend == ["val", "train loss not logged (logger=none); rerun with logger=csv or logger=wandb"]
    plot_run(run)
    assert "note: train loss not logged (logger=none)" in capsys.readouterr().out
    _, with_train = plot_curves(find_metrics(write_run(tmp_path / "csv"))[0])
    assert [t.get_text() for t in with_train["axes"][0].get_legend().get_texts()] == ["train", "val"]
