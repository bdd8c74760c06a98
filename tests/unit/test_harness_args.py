"""`mini-gpt harness`: the arguments it adds to lm-eval's command line (no lm-eval import needed)."""

from __future__ import annotations


def test_harness_device_defaults_to_auto_for_our_model_only() -> None:
    from mini_gpt.cli.harness import with_default_device

    plain = ["--model", "mini-gpt", "--tasks", "arc_easy"]
    assert with_default_device(plain) == [*plain, "--device", "auto"]
    assert with_default_device(["--model=mini-gpt"]) == ["--model=mini-gpt", "--device", "auto"]
    for unchanged in (
        [*plain, "--device", "cpu"],
        [*plain, "--device=cuda:1"],
        ["--model", "hf"],
        ["--help"],
    ):
        assert with_default_device(unchanged) == unchanged


def test_the_old_hook_commands(tmp_path, monkeypatch, capsys) -> None:
    """An older version's `install-hook` wrote mini_gpt_lm_eval.pth into site-packages: `uninstall-hook`
    still removes it (the documented way out), `install-hook` is one line saying none is needed."""
    import site

    import pytest

    from mini_gpt.cli import harness

    dirs = [tmp_path / "site", tmp_path / "user"]
    for d in dirs:
        d.mkdir()
    (dirs[1] / "mini_gpt_lm_eval.pth").write_text("import sys\n")
    monkeypatch.setattr(site, "getsitepackages", lambda: [str(dirs[0])])
    monkeypatch.setattr(site, "getusersitepackages", lambda: str(dirs[1]))
    harness.main(["uninstall-hook"])
    assert capsys.readouterr().out == f"removed {dirs[1] / 'mini_gpt_lm_eval.pth'}\n"
    assert not (dirs[1] / "mini_gpt_lm_eval.pth").exists()
    harness.main(["uninstall-hook"])  # again: nothing left, still fine
    assert capsys.readouterr().out == "no mini_gpt_lm_eval.pth to remove\n"
    with pytest.raises(SystemExit) as exit_info:
        harness.main(["install-hook"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.startswith("error: install-hook is gone: `mini-gpt harness --model")
