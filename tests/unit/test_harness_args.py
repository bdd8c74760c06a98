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
