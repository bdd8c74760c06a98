"""The configs: every tool's --help shows that tool's own keys with their comments, and only real groups;
every experiment and every option of every config group composes into valid settings; they ship inside
the package (a regular, non-editable install finds them); the output-directory guard runs before Hydra
creates a run directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import REPO, help_keys, schema_keys
from omegaconf import OmegaConf

from mini_gpt.conf import CONF_DIR, checked_config
from mini_gpt.conf.guards import WritableOutputDir, check_writable
from mini_gpt.conf.train import OptimConfig
from mini_gpt.data.config import AnyDataConfig, data_config
from mini_gpt.model.gpt import GPTConfig


def _help(*argv: str, cwd: Path) -> str:
    proc = subprocess.run(
        [sys.executable, *argv, "--help"],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,  # a hang guard: a help imports torch and Hydra, never Lightning (test_cli), ~2 s idle
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr == ""
    return proc.stdout


@pytest.mark.parametrize(
    ("verb", "tool", "schema"),
    [
        ("generate", "generate", "GenerateConfig"),
        ("export", "export", "ExportConfig"),
        ("attention-maps", "attention_maps", "AttentionMapsConfig"),
        ("inspect", "inspect", "InspectConfig"),
        ("plot", "plot", "PlotConfig"),
        ("compare", "compare", "CompareConfig"),
    ],
)
def test_tool_help_lists_its_own_keys_with_comments(
    verb: str, tool: str, schema: str, tmp_path: Path
) -> None:
    """In a fresh process: every key of the schema with the comment its source gives it (read by the
    test's own reader), no other key (these verbs have no YAML: the schema is the config), and nothing of
    the training config or of Hydra."""
    out = _help("-m", "mini_gpt.cli", verb, cwd=tmp_path)
    listed = help_keys(out)
    for key, (_, comment) in schema_keys(schema).items():
        assert comment is not None and listed[key].endswith(f"  # {comment}"), (key, out)
    own = {key.split(".")[0] for key in schema_keys(schema)}
    assert own == {key.split(".")[0] for key in listed} and not (CONF_DIR / f"{tool}.yaml").exists()
    # nothing of the training config or of Hydra's plumbing
    lines = out.splitlines()
    train_groups = {d.name for d in CONF_DIR.iterdir() if d.is_dir() and not d.name.startswith("_")}
    assert not [x for x in lines if x.split(":")[0].strip() in train_groups - own]
    assert "Configuration groups" not in out and "Powered by Hydra" not in out
    assert "hydra" not in out.lower().replace("hydra_", "")


@pytest.mark.parametrize(
    ("tool", "args", "expected"),
    [
        ("generate", ["model=baby"], "error: generate: unknown key 'model'; the keys are ckpt, init_from, "),
        ("export", ["out.x=1"], "error: out={} must be a string or null; fix it on the command line or in "),
        ("export", ["model=tiny"], "error: export: unknown key 'model'; the keys are ckpt, format, out, "),
        ("attention_maps", ["layer=[0"], "error: attention_maps: bad override (no viable alternative at "),
        ("evaluate", ["~ckpt", "~ckpt"], "error: evaluate: bad override (Could not delete from config. "),
        ("evaluate", ["tasks=bpb,hellaswag"],
         "error: evaluate: tasks=bpb,hellaswag is ambiguous: write a list "
         "in brackets, tasks=[bpb,hellaswag] (quoted for the shell: 'tasks=[bpb,hellaswag]')\n"),
    ],
)  # fmt: skip
def test_a_refused_override_is_one_line(
    tool: str, args: list[str], expected: str, monkeypatch, capsys
) -> None:
    """What Hydra refuses on a tool's command line (its own message spans several lines) is one line."""
    import importlib

    monkeypatch.setattr(sys, "argv", [tool, *args])
    with pytest.raises(SystemExit) as exc:
        importlib.import_module(f"mini_gpt.cli.{tool}").main()
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith(expected) and captured.err.count("\n") == 1


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["foo=1"], "error: train: unknown key 'foo'; the keys are model, data, optim, "),
        (["model.foo=1"], "error: train: unknown key 'model.foo'; the keys of model are vocab_size, "),
        (["experiment=nope"], "error: train: experiment=nope: there is no conf/experiment/nope.yaml; the "
         "options are finetune_cpu, "),
        (["optim.lr=["], "error: train: bad override (no viable alternative at input '['); write key=value "
         "(python train.py --help)"),
    ],
)  # fmt: skip
def test_train_refused_override_is_one_line(args: list[str], expected: str, tmp_path: Path) -> None:
    """train.py: what Hydra refuses is one line and exit status 2, and no run folder is made."""
    done = subprocess.run(
        [sys.executable, str(REPO / "train.py"), *args, f"paths.output_dir={tmp_path / 'out'}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stdout == "" and done.stderr.startswith(expected) and done.stderr.count("\n") == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("tool", ["evaluate", "prepare", "tokenizer_train"])
def test_help_lists_only_keys_of_that_tool(tool: str, capsys, compose) -> None:
    """Every key `--help` shows (dotted, at any depth) is one of that tool's composed config: no key of
    another tool's config (an evaluate help once suggested model.n_layer=6)."""
    from mini_gpt.conf import exit_with_help_if_asked

    with pytest.raises(SystemExit) as exc:
        exit_with_help_if_asked(tool, ["--help"])
    assert exc.value.code == 0
    listed = help_keys(capsys.readouterr().out)
    config = OmegaConf.to_container(compose((), tool), resolve=False)

    def present(key: str) -> bool:
        node = config
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
        return True

    assert len(listed) > 10 and ("hellaswag.limit" in listed) == (tool == "evaluate")
    assert [key for key in listed if not present(key)] == []


def test_train_help_lists_the_groups_of_its_defaults_and_no_sweep(tmp_path: Path) -> None:
    out = _help(str(REPO / "train.py"), cwd=tmp_path)
    defaults = yaml.safe_load((CONF_DIR / "train.yaml").read_text())["defaults"]
    groups = [next(iter(e)) for e in defaults if isinstance(e, dict) and next(iter(e)) != "hydra"]
    listed = {}
    for line in out.split("Options of each group", 1)[1].splitlines()[1:]:
        if line.startswith("  ") and ":" in line:
            group, options = line.strip().split(":", 1)
            listed[group] = [o.strip() for o in options.split(",")]
    assert listed == {g: sorted(p.stem for p in (CONF_DIR / g).glob("*.yaml")) for g in groups}
    assert "sweep" not in listed and (CONF_DIR / "sweep").is_dir()  # W&B sweep specs are no Hydra group
    listed = help_keys(out)
    for key, (_, comment) in schema_keys("TrainConfig").items():
        assert key in listed and (comment is None or listed[key].endswith(f"  # {comment}")), key


def test_writable_output_dir_passes(tmp_path: Path) -> None:
    check_writable(tmp_path / "outputs" / "train" / "runs" / "x", "hydra.run.dir")  # no exit
    assert not (tmp_path / "outputs").exists()  # only checked, never created


def test_read_only_output_dir_is_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    # Simulated: tests run as root, which may write anywhere except on a read-only file system.
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == tmp_path else real_access(p, mode))
    with pytest.raises(SystemExit) as info:
        check_writable(tmp_path / "outputs" / "run", "hydra.run.dir")
    assert info.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: cannot create the output directory {tmp_path / 'outputs' / 'run'}: {tmp_path} is read-only "
        "or not writable by you; set paths.output_dir=... (or hydra.run.dir=...) to a writable directory"
    ]


def test_output_dir_under_a_file_is_one_line(tmp_path: Path, capsys) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit):
        check_writable(tmp_path / "file" / "run", "hydra.sweep.dir")
    assert f"{tmp_path / 'file'} is not a directory" in capsys.readouterr().err


def test_train_config_runs_the_guard(compose) -> None:
    cfg = compose(["model=tiny"], hydra=True)
    targets = [c["_target_"] for c in cfg.hydra.callbacks.values()]
    assert f"{WritableOutputDir.__module__}.{WritableOutputDir.__name__}" in targets


def test_configs_sit_at_the_top_of_the_checkout() -> None:
    assert CONF_DIR == REPO / "conf" and (CONF_DIR / "train.yaml").is_file()


def test_the_wheel_lists_every_package_and_ships_conf() -> None:
    import tomllib

    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "mini_gpt").rglob("__init__.py")}
    assert on_disk | {"mini_gpt.configs"} == set(setuptools["packages"])
    assert setuptools["package-dir"] == {"mini_gpt.configs": "conf"}


# Groups of train.yaml's defaults list whose options are plain YAML files of that folder.
GROUPS = ("model", "data", "optim", "trainer", "callbacks", "logger", "experiment", "debug", "finetune")
# Options whose required keys are null in their YAML (the user names their corpus).
REQUIRED = {
    ("data", "text"): ["data.path=notes.txt"],
    ("data", "hf"): ["data.dataset=user/corpus"],
    ("data", "shards"): ["data.path=shards/*.bin"],
    ("experiment", "finetune_cpu"): ["data.path=notes.txt"],
}


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def _settings(cfg: Any) -> tuple[GPTConfig, AnyDataConfig, OptimConfig]:
    """The dataclasses train() builds from a composed config (unknown keys or bad values raise)."""
    model = OmegaConf.to_container(cfg.model, resolve=True)
    model["vocab_size"] = model["vocab_size"] or 65  # null: the tokenizer's, known only after preparation
    data = data_config(OmegaConf.to_container(cfg.data, resolve=True))
    optim = OmegaConf.to_object(cfg.optim)
    assert isinstance(optim, OptimConfig)
    return checked_config(GPTConfig, model, "model"), data, optim


def test_groups_in_the_defaults_list_are_the_folders(compose: Any) -> None:
    entries = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "train.yaml"))["defaults"]
    defaults = {next(iter(d)) for d in entries if isinstance(d, dict)}
    assert set(GROUPS) | {"paths", "hydra", "hparams_search"} == defaults
    assert all(_options(group) for group in GROUPS)


@pytest.mark.parametrize("group", GROUPS)
def test_every_option_of_every_group_composes(compose: Any, group: str) -> None:
    for option in _options(group):
        extra = REQUIRED.get((group, option), [])
        cfg = compose([f"{group}={option}", *extra])
        model, data, optim = _settings(cfg)
        assert cfg.trainer._target_ == "lightning.pytorch.Trainer", option
        assert cfg.trainer.max_steps > 0 and cfg.loader.batch_size > 0, option
        if group in ("model", "data", "optim"):  # the option is what the composed group holds
            own = OmegaConf.load(CONF_DIR / group / f"{option}.yaml")
            chosen = {"model": model, "data": data, "optim": optim}[group]
            own = {k: v for k, v in own.items() if k not in ("defaults", "vocab_size", "path", "dataset")}
            assert {k: getattr(chosen, k) for k in own} == {
                k: tuple(v) if k == "betas" else v for k, v in own.items()
            }, option


def test_experiments_compose_to_their_recipes(compose: Any) -> None:
    gpt2 = compose(["experiment=gpt2_124m"])
    model, data, optim = _settings(gpt2)
    assert (model.n_layer, model.n_head, model.n_embd, model.block_size) == (12, 12, 768, 1024)
    # the training recipe pads GPT-2's 50,257 tokens to 50,304 (a multiple of 64: faster matmuls);
    # the published architecture (GPTConfig's defaults, the hub's gpt2) keeps 50,257
    assert model.vocab_size == 50304 and GPTConfig().vocab_size == 50257
    assert (data.name, data.resolved_tokenizer, optim.name) == ("shakespeare", "gpt2", "adamw")
    assert 16 * gpt2.trainer.accumulate_grad_batches * 1024 == 524_288  # tokens per step, one device
    assert gpt2.trainer.precision == "bf16-mixed" and gpt2.compile is True

    gpu = compose(["experiment=shakespeare_char_gpu"])
    model, data, optim = _settings(gpu)
    assert (model.n_layer, model.n_embd, model.block_size, model.dropout) == (6, 384, 256, 0.2)
    assert (data.resolved_tokenizer, optim.name, gpu.loader.batch_size) == ("char", "adamw", 64)
    assert gpu.trainer.accelerator == "gpu" and gpu.trainer.max_steps == 5000

    cpu = compose(["experiment=shakespeare_char_cpu"])
    model, _, optim = _settings(cpu)
    assert (model.n_layer, model.n_embd, optim.name, cpu.trainer.max_steps) == (4, 128, "muon", 2500)
    assert cpu.trainer.accelerator == "cpu"

    induction = compose(["experiment=induction_heads"])  # docs/inspect.md's run: head roles in the CSV
    model, data, optim = _settings(induction)
    assert (model.n_layer, model.block_size, optim.name, data.name) == (2, 64, "adamw", "shakespeare_char")
    assert model.pos_embedding == "learned" and induction.loader.repeat_span == 32
    assert induction.callbacks.head_roles.every_n_steps == 25 and set(induction.logger) == {"csv"}
    assert compose([]).loader.repeat_span == 0  # the default run's windows are plain


def test_default_logger_writes_a_csv_log_beside_wandb(compose: Any) -> None:
    loggers = compose([]).logger
    assert set(loggers) == {"wandb", "csv"}
    assert loggers.csv._target_ == "lightning.pytorch.loggers.CSVLogger"
    assert set(compose(["logger=none"]).get("logger") or {}) == set()


def test_regular_install_finds_its_configs(tmp_path: Path) -> None:
    """Build a wheel (no network, no build isolation) from a copy of the sources, install it into a
    folder of its own and generate from another working directory: the configs come with it."""
    import torch

    from mini_gpt.interop.export import export_model
    from mini_gpt.model.gpt import GPT
    from mini_gpt.tokenizer import CharTokenizer

    src = tmp_path / "src"
    shutil.copytree(REPO / "mini_gpt", src / "mini_gpt", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "conf", src / "conf")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", tmp_path / "dist", src], check=True
    )
    [wheel] = (tmp_path / "dist").glob("mini_gpt-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--target", tmp_path / "site", wheel], check=True)

    tokenizer = CharTokenizer("ab\n")
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=16, vocab_size=3))
    export_model(model, tokenizer, tmp_path / "model", "safetensors")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    where = subprocess.run(
        [sys.executable, "-c", "import mini_gpt.conf as c; print(c.CONF_DIR)"],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert where.stdout.strip() == str(tmp_path / "site" / "mini_gpt" / "configs")  # the installed copy
    static = tmp_path / "site" / "mini_gpt" / "serve" / "static"  # the playground page is package data
    assert sorted(p.name for p in static.iterdir()) == ["app.js", "index.html", "style.css"]
    done = subprocess.run(
        [sys.executable, "-m", "mini_gpt.generate", f"ckpt={tmp_path / 'model'}", "prompt=ab",
         "max_new_tokens=5", "temperature=0"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ab") and len(done.stdout.rstrip("\n")) >= 2


def test_data_docs_commands_use_the_tokenizer_their_comment_names(compose) -> None:
    """docs/data.md's `data=text` lines compose to the tokenizer their comment promises (the walk
    through the docs found "# characters" on a command that trains GPT-2 BPE)."""
    import shlex

    lines = [
        line
        for line in (REPO / "docs" / "data.md").read_text().splitlines()
        if line.startswith("mini-gpt train data=text")
    ]
    assert len(lines) >= 2
    for line in lines:
        command, _, comment = line.partition("#")
        cfg = compose(shlex.split(command)[2:])
        expected = "char" if "characters" in comment else "gpt2" if "GPT-2 BPE" in comment else None
        assert expected is not None and cfg.data.tokenizer == expected, line
