"""Reference bands: the band's arithmetic, building one from run folders, and which runs match."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from mini_gpt.eval import reference
from mini_gpt.eval.reference import MIN_HALF_WIDTH, Reference, build_reference, recipe_key

CONFIG = {
    "model": {"block_size": 64, "n_layer": 4, "n_head": 4, "n_embd": 128, "dropout": 0.0, "bias": True,
              "norm": "layernorm", "pos_embedding": "rope", "mlp": "gelu_exact", "tie_weights": True},
    "data": {"name": "shakespeare_char", "path": None, "tokenizer": "char", "bpe_file": None,
             "val_fraction": 0.1},
    "optim": {"lr": 0.003},
    "init_from": None,
    "seed": 1,
}  # fmt: skip


def fake_run(root: Path, name: str, vals: list[float], status: str = "completed", **changes) -> Path:
    """A run folder as train.py leaves it: summary.json (768 tokens a step, evaluations every 100 steps)
    and Hydra's .hydra/config.yaml."""
    run = root / name
    (run / ".hydra").mkdir(parents=True)
    config = json.loads(json.dumps(CONFIG))
    for dotted, value in changes.items():
        section, key = dotted.split("__")
        config[section][key] = value
    (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    curve = [[100 * (i + 1), 10.0 * i, v] for i, v in enumerate(vals)]
    summary = {
        "status": status,
        "steps": 100 * len(vals),
        "tokens": 768 * 100 * len(vals),
        "val_curve": curve,
    }
    (run / "summary.json").write_text(json.dumps(summary))
    return run


def test_band_interpolates_between_evaluations_and_has_a_floor():
    ref = Reference("r", {}, tokens=[100, 200, 300], mean=[3.0, 2.0, 1.5], std=[0.1, 0.002, 0.05])
    assert ref.band(100) == (3.0, pytest.approx(0.2))
    mean, half = ref.band(150)  # halfway: mean 2.5, std 0.051 -> 2 std = 0.102
    assert mean == pytest.approx(2.5) and half == pytest.approx(0.102)
    assert ref.band(200) == (2.0, MIN_HALF_WIDTH)  # 2 std = 0.004 is below the floor
    assert ref.band(99) is None and ref.band(301) is None  # no extrapolation
    assert ref.judge(300, 1.5 + 0.099) == ("within", pytest.approx(0.099))
    assert ref.judge(300, 1.5 + 0.101) == ("above", pytest.approx(0.101))
    assert ref.judge(300, 1.5 - 0.101) == ("below", pytest.approx(-0.101))
    assert ref.judge(400, 1.0) is None


def test_build_reference_from_run_folders(tmp_path):
    seeds = [[2.5, 2.0, 1.83], [2.6, 2.1, 1.82], [2.55, 2.05, 1.80]]
    runs = [fake_run(tmp_path, f"s{i}", vals) for i, vals in enumerate(seeds)]
    built = build_reference(runs, "python train.py")
    assert built["tokens"] == [76_800, 153_600, 230_400]
    np.testing.assert_allclose(built["mean"], np.mean(seeds, axis=0))
    np.testing.assert_allclose(built["std"], np.std(seeds, axis=0, ddof=1))
    assert built["seeds"] == 3 and built["per_seed"] == seeds
    assert built["key"]["model.block_size"] == 64 and built["key"]["tokens_per_step"] == 768
    assert built["key"]["steps"] == 300
    other = fake_run(tmp_path, "ctx", [2.5, 2.0, 1.8], model__block_size=256)
    with pytest.raises(ValueError, match="same recipe"):
        build_reference([*runs, other], "x")
    with pytest.raises(ValueError, match="completed"):
        build_reference([*runs, fake_run(tmp_path, "dead", [2.5], status="diverged")], "x")


def test_a_run_matches_its_recipe_whatever_its_optimizer_or_seed(tmp_path, monkeypatch):
    refs = tmp_path / "refs"
    refs.mkdir()
    runs = [fake_run(tmp_path, f"s{i}", [2.5 + d, 2.0 + d, 1.8 + d]) for i, d in enumerate((0, 0.01, 0.02))]
    (refs / "default.json").write_text(json.dumps(build_reference(runs, "python train.py")))
    monkeypatch.setattr(reference, "REFERENCE_DIR", refs)
    key = recipe_key(CONFIG | {"optim": {"lr": 0.03}, "seed": 7}, 768, 300)
    got = reference.compare_to_reference(key, [[100, 2.9], [300, 2.4]], 768)
    assert got == {"reference": "default", "vs_reference": "above", "vs_reference_gap": pytest.approx(0.59)}
    near = reference.compare_to_reference(key, [[300, 1.815]], 768)
    assert near["vs_reference"] == "within" and near["vs_reference_gap"] == pytest.approx(0.005)
    for changed in ({"steps": 2500}, {"tokens_per_step": 1536}, {"model.n_layer": 6}, {"data.path": "x.txt"}):
        assert reference.compare_to_reference(key | changed, [[300, 1.8]], 768)["reference"] is None
    assert reference.run_reference(runs[0])[0].name == "default"


def test_shipped_references_are_well_formed():
    shipped = reference.load_references()
    assert {"default", "shakespeare_bpe_cpu"} <= {ref.name for ref in shipped}
    for ref in shipped:
        assert ref.seeds >= 3 and len(ref.tokens) == len(ref.mean) == len(ref.std) >= 2
        assert ref.tokens == sorted(ref.tokens) and all(s >= 0 for s in ref.std)
