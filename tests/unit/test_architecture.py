"""The house rules, read from the source by a small AST reader of the test's own: rooms talk through
public names, tools do not import tools, no reach into Lightning's or tiktoken's private attributes, and
no import cycles between modules."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "mini_gpt"
# The one place allowed to touch a Lightning internal, with its why-comment beside the call.
LIGHTNING_PRIVATE_ALLOWED = {"train/callbacks/checkpointing.py"}
# What mini_gpt/model/ may import: torch, its own modules, and the standard library it uses.
ALLOWED_IN_MODEL = {"torch", "mini_gpt", "__future__", "collections", "dataclasses", "math", "typing"}
# The rooms from the bottom of the house up (mini_gpt/<room>/ or mini_gpt/<room>.py): a module imports its
# own room and rooms below it, never one above. errors, files and machine are shared by all; generate.py
# and harness.py are old entry points over cli/ and eval/. A new room takes the place its imports give it.
ROOMS = ["errors", "files", "machine", "model", "tokenizer", "conf", "data", "interop", "infer", "inspect"]
ROOMS += ["eval", "viz", "train", "serve", "cli", "bench", "generate", "harness"]


def modules() -> dict[str, ast.Module]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        found[name] = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return found


MODULES = modules()


def imports_of(name: str, tree: ast.Module, top_level_only: bool = False) -> list[tuple[str, list[str]]]:
    """(module imported, names taken from it) for every `import`/`from ... import` of mini_gpt modules."""
    out = []
    nodes = tree.body if top_level_only else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] == "mini_gpt":
                out.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out.extend((a.name, []) for a in node.names if a.name.split(".")[0] == "mini_gpt")
    return out


def test_the_reader_sees_the_package():
    assert "mini_gpt.model.attention" in MODULES and "mini_gpt.train.run" in MODULES
    assert len(MODULES) > 40


def test_no_module_imports_another_modules_private_name():
    offences = [
        f"{name} imports {source}.{taken}"
        for name, tree in MODULES.items()
        for source, names in imports_of(name, tree)
        for taken in names
        if taken.startswith("_") and not taken.startswith("__") and source != name
    ]
    assert offences == []


def test_no_tool_imports_another_tool():
    offences = [
        f"{name} imports {source}"
        for name, tree in MODULES.items()
        if name.startswith("mini_gpt.cli.")
        for source, names in imports_of(name, tree)
        for target in [source, *(f"{source}.{n}" for n in names)]
        if target.startswith("mini_gpt.cli.") and target in MODULES and target != name
    ]
    assert offences == []


def private_attribute_reads(tree: ast.Module, roots: set[str]) -> list[str]:
    """`x._name` where x is (an attribute chain starting at) one of `roots`."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            chain = ast.unparse(node.value)
            if isinstance(base, ast.Name) and (base.id in roots or chain.split(".")[-1] in roots):
                found.append(f"{ast.unparse(node)} (line {node.lineno})")
    return found


def test_no_reach_into_lightning_trainer_internals_outside_one_place():
    offences = {}
    for name, tree in MODULES.items():
        rel = name.removeprefix("mini_gpt.").replace(".", "/") + ".py"
        if rel in LIGHTNING_PRIVATE_ALLOWED:
            continue
        reads = private_attribute_reads(tree, {"trainer"})
        if reads:
            offences[name] = reads
    assert offences == {}


def test_no_tiktoken_private_attributes():
    offences = {
        name: reads
        for name, tree in MODULES.items()
        if (reads := private_attribute_reads(tree, {"tiktoken"}))
    }
    assert offences == {}


def test_no_import_cycles_between_modules():
    """Imports inside functions count: a cycle hidden in a function body is still a cycle of the design."""
    graph: dict[str, set[str]] = {}
    for name, tree in MODULES.items():
        targets = set()
        for source, names in imports_of(name, tree):
            for target in (f"{source}.{n}" for n in names):
                if target in MODULES:  # `from mini_gpt.train import run` imports the module run
                    targets.add(target)
                    break
            else:
                targets.add(source)
        graph[name] = {t for t in targets if t in MODULES and t != name}

    def cycle_from(start: str) -> list[str] | None:
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    return [*path, start]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
        return None

    # A package's __init__ re-exporting its own modules is not a cycle of the design.
    cycles = [c for n in graph if (c := cycle_from(n)) and not all(m.startswith(c[0]) for m in c)]
    assert cycles == []


def room_of(module: str) -> str:
    return module.split(".")[1] if "." in module else ""  # "": the package's own __init__


def test_no_room_imports_a_room_above_it():
    """Data flows one way (docs/architecture.md); imports inside functions count."""
    assert {room_of(name) for name in MODULES} - {""} == set(ROOMS)  # every room has its place
    floor = {room: i for i, room in enumerate(ROOMS)}
    offences = [
        f"{name} ({room_of(name)}) imports {source} ({room_of(source)})"
        for name, tree in MODULES.items()
        for module, names in imports_of(name, tree)
        for source in ([f"mini_gpt.{n}" for n in names] if module == "mini_gpt" else [module])
        if floor.get(room_of(source), -1) > floor.get(room_of(name), len(ROOMS))
    ]
    assert offences == []


def test_the_cycle_reader_sees_imports_inside_functions():
    tree = ast.parse("def f():\n    from mini_gpt.train import run\n")
    assert imports_of("x", tree) == [("mini_gpt.train", ["run"])]
    assert imports_of("x", tree, top_level_only=True) == []


@pytest.mark.parametrize("room", ["model"])
def test_the_core_imports_no_framework(room):
    heavy = {"lightning", "pytorch_lightning", "hydra", "omegaconf", "transformers", "wandb"}
    offences = []
    for name, tree in MODULES.items():
        if not name.startswith(f"mini_gpt.{room}"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                offences += [f"{name}: {a.name}" for a in node.names if a.name.split(".")[0] in heavy]
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in heavy:
                offences.append(f"{name}: {node.module}")
    assert offences == []


def test_the_model_imports_only_torch_and_itself():
    """mini_gpt/model/ is a core to copy out: no mini_gpt module outside it (errors, conf, ...), no package
    but torch and the standard library."""
    offences = []
    for name, tree in MODULES.items():
        if not name.startswith("mini_gpt.model"):
            continue
        offences += [
            f"{name}: {source}"
            for source, _ in imports_of(name, tree)
            if not source.startswith("mini_gpt.model")
        ]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                offences.append(f"{name}: relative import")
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                modules = [node.module]
            offences += [f"{name}: {m}" for m in modules if m.split(".")[0] not in ALLOWED_IN_MODEL]
    assert offences == []


def _trainer_chain(node: ast.AST) -> bool:
    """`trainer.x`, `self.trainer.x`, `pl_module.trainer.x`: an attribute of a Trainer."""
    value = node.value if isinstance(node, ast.Attribute) else None
    return isinstance(value, ast.Name | ast.Attribute) and ast.unparse(value).split(".")[-1] in {
        "trainer",
        "_trainer",
    }


def test_nothing_changes_a_built_trainer():
    """The Trainer is built once with its final arguments: no code writes its attributes or loops (the one
    write allowed is `should_stop`, Lightning's public way for a module or callback to end the fit; the one
    loop read allowed is `fit_loop.state_dict()`, a copy)."""
    offences = []
    for name, tree in MODULES.items():
        copies = {
            id(node.func.value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "state_dict"
        }
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AugAssign | ast.AnnAssign) else []  # fmt: skip
            for target in targets:
                if (
                    isinstance(target, ast.Attribute)
                    and _trainer_chain(target)
                    and target.attr != "should_stop"
                ):
                    offences.append(f"{name}: {ast.unparse(target)} (line {node.lineno})")
            if isinstance(node, ast.Attribute) and node.attr == "fit_loop" and id(node) not in copies:
                offences.append(f"{name}: {ast.unparse(node)} (line {node.lineno})")
    assert offences == []


def test_callbacks_never_look_each_other_up():
    """A callback talks to the module and trainer.callback_metrics, never to another callback: no callback
    module reads `trainer.callbacks`, and none imports another callback's module (their shared base and
    the checkpoint helpers aside)."""
    shared = {"mini_gpt.train.callbacks.base", "mini_gpt.train.callbacks.checkpointing"}
    offences = []
    for name, tree in MODULES.items():
        if not name.startswith("mini_gpt.train.callbacks."):
            continue
        offences += [
            f"{name}: {ast.unparse(node)}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr == "callbacks" and _trainer_chain(node)
        ]
        offences += [
            f"{name} imports {source}"
            for source, _ in imports_of(name, tree)
            if source.startswith("mini_gpt.train.callbacks.") and source not in shared
        ]
    assert offences == []


def _names_defined_by(class_name: str) -> set[str]:
    """What a class of the package defines itself: its methods and properties, and `self.x = ...` in them."""
    for tree in MODULES.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name == class_name:
                names = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
                for sub in ast.walk(node):
                    targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target] if isinstance(
                        sub, ast.AnnAssign) else []  # fmt: skip
                    names |= {
                        t.attr
                        for t in targets
                        if isinstance(t, ast.Attribute)
                        and isinstance(t.value, ast.Name)
                        and t.value.id == "self"
                    }
                return names
    raise AssertionError(f"no class {class_name}")


# What every callback may read of the LightningModule it is handed beyond Lightning's own API: what the
# module is (its model and tokenizer). Anything else the module defines would be a channel made for one.
MODULE_ESSENCE = {"model", "tokenizer"}


def module_reads(tree: ast.Module, names: set[str]) -> list[str]:
    """`pl_module.x` / `module.x` for x in `names`, with their lines."""
    return [
        f"{ast.unparse(node)} (line {node.lineno})"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in {"pl_module", "module"}
        and node.attr in names
    ]


def test_no_callback_reads_what_the_module_made_for_it():
    """Callbacks learn through Lightning's hooks, the step's outputs and logged metrics: none reads an
    attribute or calls a method that GPTLitModule defines (its model and tokenizer aside)."""
    made_here = _names_defined_by("GPTLitModule") - MODULE_ESSENCE
    assert {"training_step", "net", "optim_config"} <= made_here  # the reader sees the module's own names
    offences = {
        name: reads
        for name, tree in MODULES.items()
        if name.startswith("mini_gpt.train.callbacks.") and (reads := module_reads(tree, made_here))
    }
    assert offences == {}


def test_the_module_reader_catches_a_channel_made_for_a_callback():
    tree = ast.parse("def on_step(trainer, pl_module):\n    x = pl_module.stats.train_history[-1]\n")
    assert module_reads(tree, {"stats"}) == ["pl_module.stats (line 2)"]
    assert module_reads(tree, {"train_history"}) == []  # only the module's own attributes count
