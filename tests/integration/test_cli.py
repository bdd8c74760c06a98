"""`mini-gpt <verb>`: the verbs and their help, an unknown verb, and each verb run once through the
dispatcher (train in a subprocess, as `python -m mini_gpt.cli`; the console script itself exists only
after a reinstall)."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import REPO, help_keys, schema_keys
from omegaconf import OmegaConf

import mini_gpt.bench.__main__ as bench_main
from mini_gpt.cli import main
from mini_gpt.conf import CONF_DIR

# Written out here (not read from mini_gpt.cli.VERBS): the names the README and users' scripts rely on.
VERBS = (
    "train",
    "generate",
    "evaluate",
    "export",
    "prepare",
    "tokenizer",
    "plot",
    "attention-maps",
    "inspect",
    "compare",
    "sweep",
    "serve",
    "bench",
    "harness",
)
# verb (its words on the command line) -> (its config in conf/, its schema dataclass, an override of the
# wrong type and the one error line it gives); bench and harness pass their arguments through (argparse,
# lm_eval). prepare and sweep compose train.yaml.
CONFIGS = {
    "train": ("train", "TrainConfig", "seed=abc", "seed='abc' must be an integer"),
    "generate": ("generate", "GenerateConfig", "max_new_tokens=abc",
                 "max_new_tokens='abc' must be an integer"),
    "evaluate": ("evaluate", "EvaluateConfig", "bpb.batch_size=abc",
                 "bpb.batch_size='abc' must be an integer"),
    "export": ("export", "ExportConfig", "overwrite=maybe", "overwrite='maybe' must be true or false"),
    "prepare": ("prepare", "TrainConfig", "data.val_fraction=lots",
                "data.val_fraction='lots' must be a number"),
    "tokenizer train": ("tokenizer_train", "TokenizerTrainConfig", "vocab_size=abc",
                        "vocab_size='abc' must be an integer"),
    "tokenizer eval": ("tokenizer_eval", "TokenizerEvalConfig", "top=abc", "top='abc' must be an integer"),
    "plot": ("plot", "PlotConfig", "dpi=abc", "dpi='abc' must be an integer"),
    "attention-maps": ("attention_maps", "AttentionMapsConfig", "dpi=abc", "dpi='abc' must be an integer"),
    "inspect": ("inspect", "InspectConfig", "windows=abc", "windows='abc' must be an integer"),
    "compare": ("compare", "CompareConfig", "scaling=maybe", "scaling='maybe' must be true or false"),
    "serve": ("serve", "ServeConfig", "port=abc", "port='abc' must be an integer"),
    "sweep": ("train", "TrainConfig", "seed=abc", "seed='abc' must be an integer"),
}  # fmt: skip
TINY_TRAIN = (
    "model=tiny",
    "logger=csv",
    "trainer.max_steps=2",
    "trainer.val_check_interval=2",
    "loader.batch_size=4",
    "loader.val_windows=4",
    "trainer.accelerator=cpu",
    "trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false",
    "callbacks.sample_text.every_n_steps=0",
)


def cli(*args: str, cwd: Path, timeout: int = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mini_gpt.cli", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def run_main(args: list[str], monkeypatch: pytest.MonkeyPatch) -> int:
    """`mini-gpt ARGS` in this process (the dispatcher rewrites sys.argv for the verb: restored after)."""
    monkeypatch.setattr(sys, "argv", ["mini-gpt", *args])
    try:
        return main(args)
    except SystemExit as exc:
        return int(exc.code or 0)


def own_keys(config: str) -> list[str]:
    """The top-level keys of conf/<config>.yaml, read with a plain YAML parser (none without one: a verb
    whose schema is its whole config)."""
    path = CONF_DIR / f"{config}.yaml"
    written = yaml.safe_load(path.read_text()) if path.exists() else {}
    return [k for k in written if k not in ("defaults", "hydra")]


def test_help_and_no_arguments_list_every_verb_with_a_line_each(tmp_path: Path) -> None:
    for args in (["--help"], []):
        proc = cli(*args, cwd=tmp_path)
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
        listed = [line.split()[0] for line in proc.stdout.splitlines() if line.startswith("  ")]
        assert tuple(listed) == VERBS
        for line in proc.stdout.splitlines():
            if line.startswith("  "):
                assert len(line.split(None, 1)[1]) > 10, line  # a description, not just the name
        export = next(line for line in proc.stdout.splitlines() if line.split()[:1] == ["export"])
        assert all(name in export for name in ("safetensors", "transformers", "GGUF")), export  # format=


@pytest.mark.skipif(shutil.which("srun") is not None, reason="a SLURM machine: the launcher would submit")
def test_the_slurm_launcher_off_a_cluster_is_one_line(tmp_path: Path) -> None:
    proc = cli("train", "-m", "hydra/launcher=slurm", "model=tiny", "optim.lr=1e-3,3e-3", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    (line,) = proc.stderr.splitlines()  # not submitit's traceback ('Could not detect "srun"')
    assert line.startswith("error: hydra/launcher=slurm submits the runs as SLURM jobs") and "no srun" in line


def test_an_unknown_verb_is_one_line_and_status_2(tmp_path: Path) -> None:
    proc = cli("trian", "model=tiny", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.startswith("error: unknown verb 'trian'; the verbs are ")
    assert line.split("the verbs are ", 1)[1].split(", ") == list(VERBS)


@pytest.mark.parametrize("verb", list(CONFIGS))
def test_each_verb_help_lists_its_keys_with_types_and_comments(verb: str, monkeypatch, capsys) -> None:
    """The reference: the schema dataclass's fields, types and comments as the test reads them from the
    source (helpers.schema_keys), and the keys of the verb's YAML."""
    config, schema = CONFIGS[verb][:2]
    assert run_main([*verb.split(), "--help"], monkeypatch) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    listed = help_keys(captured.out)
    for key, (words, comment) in schema_keys(schema).items():
        assert key in listed, (verb, key)
        assert words is None or f" ({words})" in listed[key], (verb, key, listed[key])
        assert comment is None or listed[key].endswith(f"  # {comment}"), (verb, key, listed[key])
    assert set(own_keys(config)) <= set(listed)
    lines = captured.out.splitlines()
    if verb in ("train", "prepare"):  # train.yaml's groups with their options
        data = next(line for line in lines if line.startswith("  data: "))
        assert data.split(": ", 1)[1].split(", ") == sorted(
            p.stem for p in (CONF_DIR / "data").glob("*.yaml")
        )
        assert ("--cfg job" in captured.out) == (verb == "train")  # Hydra's flags only where Hydra runs
    if verb == "prepare":
        assert lines[0].startswith("usage: mini-gpt prepare ") and "defaults:" not in captured.out


@pytest.mark.parametrize("verb", list(CONFIGS))
def test_each_verb_refuses_a_wrong_type_and_an_unknown_key_in_one_line(
    verb: str, monkeypatch, capsys
) -> None:
    config, _, wrong, expected = CONFIGS[verb]
    for override, line in [
        (wrong, f"error: {expected}; fix it on the command line or in the config"),
        ("nosuchkey=1", f"error: {config}: unknown key 'nosuchkey'; the keys are "),
    ]:
        assert run_main([*verb.split(), override], monkeypatch) == 2, (verb, override)
        captured = capsys.readouterr()
        assert captured.out == "" and len(captured.err.splitlines()) == 1, (verb, captured)
        assert captured.err.startswith(line), (verb, captured.err)


def test_passthrough_verbs_help(tmp_path: Path) -> None:
    bench = cli("bench", "--help", cwd=tmp_path)
    assert bench.returncode == 0 and bench.stdout.startswith("usage: mini-gpt bench "), bench.stderr
    section = cli("bench", "attention", "--help", cwd=tmp_path)
    assert section.returncode == 0 and section.stdout.startswith("usage: mini-gpt bench attention ")
    assert "--quick" in section.stdout
    harness = cli("harness", "--help", cwd=tmp_path)  # lm_eval's own command line
    assert harness.returncode == 0 and "Language Model Evaluation Harness" in harness.stdout, harness.stderr


def test_sweep_help_starts_with_the_keys_sweep_adds(monkeypatch, capsys) -> None:
    """The hparams_search keys (those of the shipped search, read with a plain YAML parser), each on its
    own line, before train's keys: sweep's help once was train's, the search space nowhere."""
    assert run_main(["sweep", "--help"], monkeypatch) == 0
    out = capsys.readouterr().out
    ours, train = out.split("usage: python train.py", 1)
    assert ours.startswith("hparams_search:") and "model:" in train
    keys = yaml.safe_load((CONF_DIR / "hparams_search" / "lr_search.yaml").read_text())
    listed = [line.split(":")[0].strip() for line in ours.splitlines() if line.startswith("  ")]
    assert set(keys) <= set(listed), (sorted(keys), listed)


def test_no_help_imports_lightning_or_transformers(tmp_path: Path) -> None:
    """`--help` of every verb and bench section in one fresh process: none imports Lightning or transformers
    (seconds each; sweep's help imported both), so a help costs torch's and Hydra's imports only."""
    helps = [[*verb.split(), "--help"] for verb in [*VERBS, "tokenizer train", "tokenizer eval"]]
    helps += [["bench", section, "--help"] for section in bench_main.SECTIONS]
    code = f"""
import contextlib, io, sys
import mini_gpt.bench.__main__ as bench_main
from mini_gpt.cli import main
for argv in {helps!r}:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            main(argv)
        except SystemExit:
            pass
    heavy = [name for name in ("lightning", "transformers") if name in sys.modules]
    print(" ".join(argv), *heavy, sep=" | ")
"""
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == [" ".join(argv) for argv in helps]


def test_a_refused_override_names_the_verb(monkeypatch, capsys) -> None:
    assert run_main(["plot", "run", "colour=red"], monkeypatch) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == "error: plot: unknown key 'colour'; the keys are run_dir, out, dpi"
    assert run_main(["attention-maps", "layer=[0"], monkeypatch) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.endswith("write key=value (mini-gpt attention-maps --help)")


def test_train_cfg_job_prints_the_composed_config(tmp_path: Path, compose) -> None:
    proc = cli("train", "--cfg", "job", "model=tiny", "optim.lr=0.005", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    printed = yaml.safe_load(proc.stdout)
    expected = OmegaConf.to_container(compose(["model=tiny", "optim.lr=0.005"]))
    assert printed == expected and printed["optim"]["lr"] == 0.005 and printed["model"]["n_layer"] == 2
    assert not (tmp_path / "outputs").exists()
    hydra = cli("train", "--cfg", "hydra", cwd=tmp_path)  # the job is named "train", as from train.py
    assert hydra.returncode == 0 and yaml.safe_load(hydra.stdout)["hydra"]["job"]["name"] == "train"


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, shakespeare_path: Path) -> Path:
    """`mini-gpt train` with a tiny override set: the run directory."""
    tmp = tmp_path_factory.mktemp("cli_train")
    run_dir = tmp / "run"
    proc = cli(
        "train",
        *TINY_TRAIN,
        f"data.path={shakespeare_path}",
        f"data.data_dir={tmp / 'data'}",
        f"hydra.run.dir={run_dir}",
        cwd=tmp,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


def test_train_runs_the_same_hydra_app_as_train_py(trained: Path) -> None:
    summary = json.loads((trained / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["last_ckpt"] == str(trained / "checkpoints" / "last.ckpt")
    assert (trained / ".hydra" / "config.yaml").is_file() and (trained / "train.log").is_file()
    overrides = yaml.safe_load((trained / ".hydra" / "overrides.yaml").read_text())
    assert overrides[: len(TINY_TRAIN)] == list(TINY_TRAIN)  # the verb itself is no override


def test_the_other_verbs_on_the_trained_checkpoint(
    trained: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    ckpt = trained / "checkpoints" / "last.ckpt"
    # generate: prompt= verbatim (a comma and a colon), stop= repeatable
    args = ["generate", f"ckpt={ckpt}", "prompt=ROMEO, my lord:", "max_new_tokens=4", "device=cpu", "seed=3"]
    assert run_main(args, monkeypatch) == 0
    assert capsys.readouterr().out.startswith("ROMEO, my lord:")
    # evaluate: bits per byte of a small text file, written to results.json
    (tmp_path / "t.txt").write_text("To be, or not to be, that is the question.\n" * 8)
    out = tmp_path / "results.json"
    args = ["evaluate", f"ckpt={ckpt}", f"bpb.path={tmp_path / 't.txt'}", f"output={out}", "device=cpu"]
    assert run_main(args, monkeypatch) == 0
    assert json.loads(out.read_text())["bpb"]["bits_per_byte"] > 0
    # export: a safetensors directory that generate reads back
    assert run_main(["export", f"ckpt={ckpt}", f"out={tmp_path / 'exp'}"], monkeypatch) == 0
    assert (tmp_path / "exp" / "model.safetensors").is_file()
    # attention-maps: a PNG
    args = ["attention-maps", f"ckpt={tmp_path / 'exp'}", "prompt=ROMEO:", f"out={tmp_path / 'a.png'}"]
    assert run_main(args, monkeypatch) == 0
    assert (tmp_path / "a.png").read_bytes()[:4] == b"\x89PNG"
    # plot: the run's CSV log, RUN_DIR positional
    assert run_main(["plot", str(trained), f"out={tmp_path / 'curves.png'}", "dpi=40"], monkeypatch) == 0
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_plot_on_a_hand_written_log(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "csv").mkdir(parents=True)
    (run / "csv" / "metrics.csv").write_text(
        "lr,step,train/loss,val/loss\n0.001,10,4.0,\n,10,,3.9\n0.001,20,3.0,\n"
    )
    proc = cli("plot", str(run), "dpi=40", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == f"wrote {run / 'curves.png'}"
    assert (run / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_prepare_tokenizes_without_training(tmp_path: Path, shakespeare_path: Path) -> None:
    proc = cli("prepare", f"data.path={shakespeare_path}", f"data.data_dir={tmp_path}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (line,) = proc.stdout.splitlines()
    assert line.startswith(f"ready: {tmp_path / 'shakespeare_char'}: ")
    train, val = (int(part.split()[0].replace(",", "")) for part in line.split(": ", 2)[2].split(", ")[:2])
    # one token per character (the default char model): train + val is the whole corpus
    assert train + val == len(shakespeare_path.read_text()) and 0 < val < train
    bad = cli("prepare", "data=nope", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.startswith("error: prepare: data=nope: there is no conf/data/")


def test_a_warning_of_the_package_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_bytes(b"caf\xe9 au lait \xff " + b"plain text. " * 400)
    text = ("data=text", "data.path=notes.txt", "data.tokenizer=char", f"data.data_dir={tmp_path}")
    proc = cli("prepare", *text, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    # not Python's "<file>:<line>: UnicodeWarning: ..." and the source line under it
    expected = "warning: 2 byte(s) in notes.txt are not valid UTF-8 and were replaced by U+FFFD"
    assert proc.stderr.splitlines() == [expected]


def test_resume_hint_names_mini_gpt_train(monkeypatch, tmp_path: Path) -> None:
    from mini_gpt.train.callbacks import resume_command

    monkeypatch.setattr(sys, "argv", ["mini-gpt train", "model=tiny"])
    assert resume_command(tmp_path / "last.ckpt") == f"mini-gpt train ckpt_path={tmp_path / 'last.ckpt'}"


def test_no_cli_module_imports_another() -> None:
    """The tools share helpers through mini_gpt.conf and the rooms, never through each other; only the
    dispatcher (mini_gpt/cli/__init__.py) names them, as strings it imports on demand."""
    tools = {
        p.stem for p in (REPO / "mini_gpt" / "cli").glob("*.py") if p.stem not in ("__init__", "__main__")
    }
    assert {"train", "generate", "evaluate", "export", "prepare", "plot", "attention_maps"} <= tools
    for tool in tools:
        tree = ast.parse((REPO / "mini_gpt" / "cli" / f"{tool}.py").read_text())
        imported = [
            node.module if isinstance(node, ast.ImportFrom) else alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom)
            for alias in node.names
        ]
        assert not [m for m in imported if m and m.startswith("mini_gpt.cli")], (tool, imported)
