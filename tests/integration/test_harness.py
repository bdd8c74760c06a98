"""The lm-eval adapter `mini-gpt` against lm-eval's own `hf` model on the exported directory, offline."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from helpers import REPO, WORDS, bpe_model, write_lightning_ckpt

from mini_gpt.interop.export import export_model
from mini_gpt.tokenizer import build_tokenizer

pytest.importorskip
from lm_eval import simple_evaluate  # noqa: E402
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.api.registry import get_model  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

from mini_gpt.eval import harness  # noqa: E402
from mini_gpt.eval.harness import MiniGPTLM, register, run_harness  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def write_task(root: Path, n: int = 24) -> Path:
    """A 4-way multiple-choice task over a local jsonl: data_files as a dict of splits (a single path
    would land in split `train`)."""
    rng = random.Random(0)
    rows = []
    for _ in range(n):
        question = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 10)))
        choices = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6))) for _ in range(4)]
        rows.append({"question": question, "choices": choices, "label": rng.randrange(4)})
    (root / "mc.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "tiny_mc.yaml").write_text(
        textwrap.dedent(
            f"""\
            task: tiny_mc
            dataset_path: json
            dataset_kwargs:
              data_files:
                validation: {root / "mc.jsonl"}
            validation_split: validation
            output_type: multiple_choice
            doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
            doc_to_target: "{{{{label}}}}"
            doc_to_choice: "{{{{choices}}}}"
            metric_list:
              - metric: acc
              - metric: acc_norm
            """
        )
    )
    return root


@pytest.fixture(scope="module")
def setup(tmp_path_factory, gpt2_bpe_file):
    root = tmp_path_factory.mktemp("harness")
    tok = build_tokenizer("gpt2", bpe_file=gpt2_bpe_file)
    model = bpe_model(seed=5, block_size=64)
    hf_dir = export_model(model, tok, root / "hf", "hf")
    ckpt = write_lightning_ckpt(root / "model.ckpt", model, tok)
    return {
        "root": root,
        "tok": tok,
        "model": model,
        "hf_dir": hf_dir,
        "ckpt": ckpt,
        "task": write_task(root),
    }


def hf_lm(hf_dir: Path):
    return get_model("hf").create_from_arg_obj(
        {"pretrained": str(hf_dir), "tokenizer": str(hf_dir), "dtype": "float32"},
        {"device": "cpu", "batch_size": 4},
    )


def test_adapter_matches_the_harness_hf_model_on_a_local_multiple_choice_task(setup):
    manager = TaskManager(include_path=str(setup["task"]), include_defaults=False)
    ours = simple_evaluate(
        model=MiniGPTLM(model=setup["model"], tokenizer=setup["tok"], batch_size=5),
        tasks=["tiny_mc"], task_manager=manager, log_samples=True, bootstrap_iters=0,
    )  # fmt: skip
    theirs = simple_evaluate(
        model=hf_lm(setup["hf_dir"]),
        tasks=["tiny_mc"],
        task_manager=manager,
        log_samples=True,
        bootstrap_iters=0,
    )
    for metric in ("acc,none", "acc_norm,none"):
        assert ours["results"]["tiny_mc"][metric] == theirs["results"]["tiny_mc"][metric]
    ours_ll = [r[0][0] for s in ours["samples"]["tiny_mc"] for r in s["resps"]]
    theirs_ll = [r[0][0] for s in theirs["samples"]["tiny_mc"] for r in s["resps"]]
    assert len(ours_ll) == 24 * 4
    assert ours_ll == pytest.approx(theirs_ll, abs=1e-4)
    # not a degenerate task: the choices differ in likelihood
    assert len({round(x, 3) for x in ours_ll}) > 50


def test_rolling_and_greedy_generation_match_the_hf_model(setup):
    ours = MiniGPTLM(model=setup["model"], tokenizer=setup["tok"], batch_size=3)
    theirs = hf_lm(setup["hf_dir"])
    rng = random.Random(1)
    texts = [" ".join(rng.choice(WORDS) for _ in range(k)) for k in (3, 40, 150)]  # 150 words > block_size
    rolling = [Instance("loglikelihood_rolling", {}, (t,), i) for i, t in enumerate(texts)]
    assert ours.loglikelihood_rolling(rolling, disable_tqdm=True) == pytest.approx(
        theirs.loglikelihood_rolling(rolling, disable_tqdm=True), abs=1e-3
    )
    gen = [
        Instance("generate_until", {}, (t, {"until": ["kitchen"], "max_gen_toks": 12, "do_sample": False}), i)
        for i, t in enumerate(texts[:2])
    ]
    assert ours.generate_until(gen, disable_tqdm=True) == theirs.generate_until(gen, disable_tqdm=True)


def test_run_harness_returns_plain_metrics_and_rejects_unknown_tasks(setup):
    from mini_gpt.errors import MiniGPTError

    local = {"include_path": str(setup["task"]), "builtin_tasks": False}
    res = run_harness(setup["model"], setup["tok"], ["tiny_mc"], limit=8, **local)
    assert set(res) == {"tiny_mc"}
    assert {"acc", "acc_norm"} <= set(res["tiny_mc"])
    assert 0 <= res["tiny_mc"]["acc"] <= 1
    with pytest.raises(MiniGPTError, match="unknown lm-eval task"):
        run_harness(setup["model"], setup["tok"], ["no_such_task_xyz"], **local)


def test_registration_is_idempotent_in_every_order():
    """A second `register()`, a second copy of the module (run as `__main__`, reloaded), or the name first
    held by the lazy target `mini_gpt.eval.harness:MiniGPTLM`: none fails, and the name stays ours."""
    assert get_model("mini-gpt") is MiniGPTLM and get_model("hf").__name__ == "HFLM"
    register()
    spec = importlib.util.spec_from_file_location("__main__", harness.__file__)
    copy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copy)  # what `python -m mini_gpt.eval.harness` would run
    copy.register()
    assert copy.MiniGPTLM is not MiniGPTLM and get_model("mini-gpt") is MiniGPTLM

    code = textwrap.dedent(
        """\
        import lm_eval.models
        from lm_eval.api.registry import get_model, model_registry
        model_registry.register("mini-gpt", target=TARGET)
        from mini_gpt.eval import harness
        harness.register()
        assert get_model("mini-gpt") is harness.MiniGPTLM and get_model("hf").__name__ == "HFLM"
        """
    )
    # The second target is what an older version's install-hook (a .pth file run at every start-up)
    # registers: it must still resolve to our class, or every harness run fails.
    for target in ("mini_gpt.eval.harness:MiniGPTLM", "mini_gpt.harness:MiniGPTLM"):
        proc = subprocess.run(
            [sys.executable, "-c", code.replace("TARGET", repr(target))], capture_output=True, text=True,
            timeout=240, env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-2000:]


def test_harness_command_runs_a_checkpoint(setup):
    """`mini-gpt harness ARGS`: lm-eval's command line with `mini-gpt` registered."""
    args = ["--model", "mini-gpt", "--model_args", f"ckpt={setup['ckpt']}", "--tasks", "tiny_mc",
            "--include_path", str(setup["task"]), "--limit", "6"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "mini_gpt.cli", "harness", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "|tiny_mc|" in proc.stdout.replace(" ", "")
    assert "device=cuda" not in proc.stderr  # lm-eval's default device is not ours to warn about
    assert "acc_norm" in proc.stdout


def test_adapter_loads_a_checkpoint_by_path(setup):
    lm = MiniGPTLM(ckpt=str(setup["ckpt"]), batch_size="auto")
    assert lm.batch_size == 16 and lm.max_length == 64
    req = [Instance("loglikelihood", {}, ("the man", " walks"), 0)]
    direct = MiniGPTLM(model=setup["model"], tokenizer=setup["tok"]).loglikelihood(req, disable_tqdm=True)
    ((logprob, greedy),) = lm.loglikelihood(req, disable_tqdm=True)
    ((direct_logprob, direct_greedy),) = direct
    assert logprob == pytest.approx(direct_logprob) and greedy == direct_greedy
    assert torch.equal(lm.model.lm_head.weight, setup["model"].lm_head.weight)


def test_harness_command_without_the_task_data_offline_is_one_line(monkeypatch, capsys):
    import lm_eval.__main__

    from mini_gpt.cli.harness import main

    def offline(*_args):  # what `datasets` raises offline for a task it has not cached
        raise ConnectionError("Couldn't reach 'allenai/ai2_arc' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(lm_eval.__main__, "cli_evaluate", offline)
    with pytest.raises(SystemExit) as exit_info:
        main(["--model", "mini-gpt", "--tasks", "arc_easy"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: Couldn't reach 'allenai/ai2_arc'")
    assert "HF_DATASETS_CACHE" in err


def test_harness_command_with_the_hub_unreachable_runs_offline_and_says_so(monkeypatch, capsys):
    """No offline switch and no network: `datasets` would retry each file for ~40 s, a log line a try.
    The command sees the Hub does not answer, runs lm-eval offline (cached and local tasks still run),
    and a task whose data is not cached is one line saying the Hub is unreachable."""
    import lm_eval.__main__

    from mini_gpt.cli.harness import main

    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there: refused at once
    switches = {}

    def offline(*_args):
        switches.update((var, os.environ.get(var)) for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))
        raise ConnectionError("Couldn't reach 'allenai/ai2_arc' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(lm_eval.__main__, "cli_evaluate", offline)
    with pytest.raises(SystemExit) as exit_info:
        main(["--model", "mini-gpt", "--tasks", "arc_easy"])
    assert exit_info.value.code == 2
    assert switches == {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: Couldn't reach 'allenai/ai2_arc'")
    assert "the Hugging Face Hub is unreachable (127.0.0.1:9 does not answer" in err
    assert "--include_path DIR" in err


@pytest.mark.parametrize("task", ["tiny_mc", "arc_easy"])
def test_harness_command_without_network_or_offline_switch(setup, task, tmp_path):
    """The real command, Hub unreachable and no switch set: a local task runs; a Hub task fails at once,
    without `datasets`' retries, as one error line."""
    args = ["--model", "mini-gpt", "--model_args", f"ckpt={setup['ckpt']}", "--tasks", task,
            "--include_path", str(setup["task"]), "--limit", "6"]  # fmt: skip
    unset = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_DATASETS_CACHE", "HF_HUB_CACHE")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    # An empty cache: on a machine that once ran arc_easy online, its data would be found there.
    env.update(PYTHONPATH=str(REPO), HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(tmp_path / "hf"))
    cmd = [sys.executable, "-m", "mini_gpt.cli", "harness", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    if task == "tiny_mc":
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "|tiny_mc|" in proc.stdout.replace(" ", "")
    else:
        assert proc.returncode == 2 and "Retry" not in proc.stderr, proc.stderr[-2000:]
        log = re.compile(r"\d{4}-\d\d-\d\d:\d\d:\d\d:\d\d (INFO|WARNING) ")  # lm-eval's own log lines
        errors = [line for line in proc.stderr.splitlines() if not log.match(line)]
        assert len(errors) == 1 and errors[0].startswith("error: ") and "Hub is unreachable" in errors[0]


def test_character_export_runs_on_the_harness_hf_model_with_the_printed_prefix(tmp_path, capsys):
    """A character vocabulary has no end-of-text token, so lm-eval's hf model needs prefix_token_id:
    `mini-gpt export` prints it, and with it the hf model scores as our adapter does."""
    from lm_eval.models.huggingface import HFLM

    from mini_gpt.cli.export import main as export_main
    from mini_gpt.model.gpt import GPT, GPTConfig
    from mini_gpt.tokenizer import CharTokenizer

    tok = CharTokenizer.from_text("\n".join(WORDS) + " ROMEO:")
    torch.manual_seed(3)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=tok.vocab_size, block_size=32)).eval()
    ckpt = write_lightning_ckpt(tmp_path / "char.ckpt", model, tok)
    export_main([f"ckpt={ckpt}", "format=hf", f"out={tmp_path / 'hf'}"])
    newline = tok.encode("\n")[0]
    assert f"add prefix_token_id={newline} " in capsys.readouterr().out
    theirs = HFLM(pretrained=str(tmp_path / "hf"), device="cpu", batch_size=2, prefix_token_id=newline)
    req = [Instance("loglikelihood", {}, ("", "the man walks"), 0)]  # empty context: the prefix matters
    ((expected, _),) = MiniGPTLM(model=model, tokenizer=tok).loglikelihood(req, disable_tqdm=True)
    ((got, _),) = theirs.loglikelihood(req, disable_tqdm=True)
    assert got == pytest.approx(expected, abs=1e-4)
