"""Imports point one way (docs/architecture.md), with no exemptions:

    base (errors, config, files) < model < target / data / objectives < train / decoding
    < tracking / launch < stages < cli

A module may import its own layer or lower ones, anywhere in its body (imports inside functions count
too). mlflow is imported only in tracking/, kubernetes only in launch/, and kfp only by the Kubeflow edge
(stages/run.py and stages/submit.py), inside functions, so the library imports without it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "flashdraft"

LAYERS = [
    {"__init__", "errors", "config", "files"},
    {"model"},
    {"target", "data", "objectives"},
    {"train", "decoding"},
    {"tracking", "launch"},
    {"stages"},
    {"cli"},
]
LAYER_OF = {name: index for index, names in enumerate(LAYERS) for name in names}
ONLY_IN = {  # third-party package -> the modules allowed to import it
    "mlflow": lambda module: module.split(".")[:2] == ["flashdraft", "tracking"],
    "kubernetes": lambda module: module.split(".")[:2] == ["flashdraft", "launch"],
    "kfp": lambda module: module in ("flashdraft.stages.run", "flashdraft.stages.submit"),
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def imported_modules(path: Path, top_level_only: bool = False) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names = set()
    nodes = tree.body if top_level_only else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import
                package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            names.add(module)
            # `from flashdraft import target` imports the module flashdraft.target
            names.update(f"{module}.{alias.name}" for alias in node.names if module == "flashdraft")
    return names


def layer(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "flashdraft":
        return None
    if len(parts) == 1:
        return 0
    assert parts[1] in LAYER_OF, f"{module} belongs to no layer: add it to LAYERS (and docs/architecture.md)"
    return LAYER_OF[parts[1]]


def library_modules():
    for path in sorted(SRC.rglob("*.py")):
        yield module_name(path), path


def violations(modules) -> list[str]:
    found = []
    for name, path in modules:
        own = layer(name)
        for imported in imported_modules(path):
            other = layer(imported)
            if other is not None and imported != "flashdraft" and other > own:
                found.append(f"{name} (layer {own}) imports {imported} (layer {other})")
            root = imported.split(".")[0]
            if root in ONLY_IN and not ONLY_IN[root](name):
                found.append(f"{name} imports {root}")
        if "kfp" in {m.split(".")[0] for m in imported_modules(path, top_level_only=True)}:
            found.append(f"{name} imports kfp at module level")
    return found


def test_imports_point_down_the_layers_and_third_party_packages_stay_in_their_place():
    assert violations(library_modules()) == []


def test_the_walker_sees_each_kind_of_violation(tmp_path):
    # The rules are only as good as the walker: a probe that breaks each must be caught.
    probe = SRC / "model" / "_layering_probe.py"
    probe.write_text("import kfp\n\ndef f():\n    from flashdraft.tracking import registry\n    import mlflow\n"
                     "    import kubernetes.client\n")
    try:
        found = violations([(module_name(probe), probe)])
    finally:
        probe.unlink()
    assert sorted(found) == [
        "flashdraft.model._layering_probe (layer 1) imports flashdraft.tracking (layer 4)",
        "flashdraft.model._layering_probe imports kfp",
        "flashdraft.model._layering_probe imports kfp at module level",
        "flashdraft.model._layering_probe imports kubernetes",
        "flashdraft.model._layering_probe imports mlflow",
    ]


def test_components_import_flashdraft_only_inside_their_bodies_and_pipelines_only_components():
    components = sorted((ROOT / "components").glob("*/component.py"))
    assert len(components) >= 5
    for path in components:
        assert not any(m.split(".")[0] == "flashdraft" for m in imported_modules(path, top_level_only=True)), path
    for path in sorted((ROOT / "pipelines").glob("*.py")):
        assert not any(m.split(".")[0] == "flashdraft" for m in imported_modules(path)), f"{path} imports flashdraft"
