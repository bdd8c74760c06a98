"""pyproject.toml's declared dependencies and CI's lock (.ci/constraints.txt) agree.

A dependency added or re-ranged in pyproject.toml without `.ci/run --lock` would make CI resolve it from
whatever the index serves that day; these tests catch that before CI does.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

tomllib = pytest.importorskip("tomllib", reason="the standard library reads TOML from Python 3.11 on")
ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _pins() -> dict[str, Version]:
    pins = {}
    for line in (ROOT / ".ci" / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"not an exact pin: {line!r}"
            pins[canonicalize_name(name)] = Version(version)
    return pins


def _declared() -> list[Requirement]:
    lists = [PROJECT["dependencies"], *PROJECT["optional-dependencies"].values()]
    reqs = [Requirement(text) for texts in lists for text in texts]
    return [r for r in reqs if canonicalize_name(r.name) != canonicalize_name(PROJECT["name"])]


def test_every_declared_dependency_is_pinned_within_its_range():
    pins = _pins()
    for req in _declared():
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is declared but not in .ci/constraints.txt: run .ci/run --lock"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"{req.name}=={pins[name]} (locked) is outside pyproject.toml's {req}: run .ci/run --lock"
        )


def test_torch_is_the_cpu_build_of_the_ci_pin():
    pinned = re.search(r'^torch_pin="torch==([^"]+)"$', (ROOT / ".ci" / "run").read_text(), re.M)
    assert pinned, '.ci/run no longer names its torch pin as torch_pin="torch==X"'
    torch = _pins()["torch"]
    assert torch.public == pinned[1] and torch.local == "cpu", f"locked torch=={torch}, CI pins {pinned[1]}"


def test_dev_holds_every_extra_but_llama():
    """`dev` runs every feature's tests; `llama` (llama-cpp-python, compiled at install) is CI's addition."""
    extras = PROJECT["optional-dependencies"]
    own = PROJECT["name"] + "["  # an extra written as mini-gpt[...]: other extras of this project
    in_dev = {extra for text in extras["dev"] if text.startswith(own) for extra in Requirement(text).extras}
    aliases = {name for name, texts in extras.items() if all(t.startswith(own) for t in texts)}
    assert in_dev == set(extras) - aliases - {"dev", "llama"}
    tools = {canonicalize_name(Requirement(t).name) for t in extras["dev"]}
    assert tools >= {"pytest", "pytest-timeout", "ruff"}
    assert [canonicalize_name(Requirement(t).name) for t in extras["llama"]] == ["llama-cpp-python"]


def _installed_by(extras: set[str]) -> set[str]:
    """The distributions `pip install -e ".[extras]"` asks for, this project's own extras followed."""
    names = {canonicalize_name(Requirement(text).name) for text in PROJECT["dependencies"]}
    todo, seen = set(extras), set()
    while todo:
        extra = todo.pop()
        seen.add(extra)
        for req in map(Requirement, PROJECT["optional-dependencies"][extra]):
            if canonicalize_name(req.name) == canonicalize_name(PROJECT["name"]):
                todo |= req.extras - seen
            else:
                names.add(canonicalize_name(req.name))
    return names


def test_the_readme_runs_with_the_base_install_and_tests_with_dev():
    """The first of the README's two commands installs what the run needs, not the test tools; the second
    installs `dev`, which compiles nothing (llama.cpp, 5-15 minutes on 2 cores, is the `llama` extra), and
    runs pytest, as .ci/run does with the llama extra added and reporting flags only."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"^## Two commands\n+```bash\n(.*?)```", readme, re.M | re.S)
    assert block, "README.md has no '## Two commands' section with a bash block"
    run, test = (line.split("#")[0].split() for line in block[1].strip().splitlines())
    assert run[:3] == ["pip", "install", "-e"] and run[4:] == ["&&", "python", "train.py"], run
    extras = re.fullmatch(r'"?\.(?:\[([\w,-]*)\])?"?', run[3])
    assert extras, f"the first command installs {run[3]}, not this project"
    installed = _installed_by(set(filter(None, (extras[1] or "").split(","))))
    assert {"llama-cpp-python", "pytest", "ruff"}.isdisjoint(installed), sorted(installed)
    assert test == ["pip", "install", "-e", '".[dev]"', "&&", "pytest"], test
    assert "llama-cpp-python" not in _installed_by({"dev"})
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'pip install --quiet -e ".[dev,llama]" -c "$constraints"' in ci
    command = ci.rstrip().splitlines()[-1].split()  # the README's `pytest`, plus reporting flags only
    assert command[0] == "pytest" and all(flag.startswith("--durations=") for flag in command[1:]), command
