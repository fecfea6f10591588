"""Imports point one way (architecture.md); kfp and mlflow stay in the modules allowed to use them.

Layers, low to high: base (errors, config) < model < target / data / strategies < train / spec <
registry / launch < commands and cli. A module may import its own layer or lower ones, anywhere in its
body (imports inside functions count too). Two refinements of the picture in architecture.md:
- command modules (those `cli.COMMANDS` names) and top-level modules not in the table are entry points:
  they sit at the cli layer, so nothing below may import them. model/draft_init.py is the exception: it
  is also the library's draft builder (the trainer builds fresh drafts with it), reading the target's
  config, so it sits with target/data/strategies;
- tracking.py is the one logging sink every layer writes through (the trainer logs its metrics), so any
  layer may import it, and it may import only the base.
"""

from __future__ import annotations

import ast
from pathlib import Path

from flashdraft.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "flashdraft"

BASE, MODEL, INPUTS, CORE, SERVICES, ENTRY = range(6)
LAYER_OF_PACKAGE = {
    "__init__": BASE, "errors": BASE, "config": BASE, "tracking": BASE,
    "model": MODEL,
    "target": INPUTS, "target_cache": INPUTS, "data": INPUTS, "strategies": INPUTS,
    "train": CORE, "spec": CORE,
    "registry": SERVICES, "launch": SERVICES, "train_launch": SERVICES,
    "cli": ENTRY, "orchestrate": ENTRY, "promote": ENTRY,
}
LAYER_OF_MODULE = {"flashdraft.stages.draft_init": INPUTS}
COMMAND_MODULES = {module for module, _ in COMMANDS.values()}
KFP_ALLOWED = {"flashdraft.stages.run"}
MLFLOW_ALLOWED = {"flashdraft.tracking", "flashdraft.tracking.registry"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names = set()
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                prefix = ".".join(base)
                module = f"{prefix}.{node.module}" if node.module else prefix
            else:
                module = node.module
            names.add(module)
            # `from flashdraft import target` imports the module flashdraft.target
            names.update(f"{module}.{alias.name}" for alias in node.names if module == "flashdraft")
    return names


def layer(module: str) -> int | None:
    if module in LAYER_OF_MODULE:
        return LAYER_OF_MODULE[module]
    if module in COMMAND_MODULES:
        return ENTRY
    parts = module.split(".")
    if parts[0] != "flashdraft":
        return None
    if len(parts) == 1:
        return BASE
    return LAYER_OF_PACKAGE.get(parts[1], ENTRY)


def library_modules():
    for path in sorted(SRC.rglob("*.py")):
        yield module_name(path), path


def test_imports_point_down_the_layers():
    violations = []
    for name, path in library_modules():
        own = layer(name)
        for imported in imported_modules(path):
            other = layer(imported)
            if imported == "flashdraft":
                continue
            if other is not None and other > own:
                violations.append(f"{name} (layer {own}) imports {imported} (layer {other})")
    assert not violations, "\n".join(violations)


def test_only_orchestrate_imports_kfp_and_only_tracking_registry_import_mlflow():
    offenders = []
    for name, path in library_modules():
        roots = {imported.split(".")[0] for imported in imported_modules(path)}
        if "kfp" in roots and name not in KFP_ALLOWED:
            offenders.append(f"{name} imports kfp")
        if "mlflow" in roots and name not in MLFLOW_ALLOWED:
            offenders.append(f"{name} imports mlflow")
    assert not offenders, "\n".join(offenders)


def test_orchestrate_imports_kfp_only_inside_functions():
    tree = ast.parse((SRC / "orchestrate.py").read_text())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = {a.name for n in top if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in top if isinstance(n, ast.ImportFrom)}
    assert not any(n.split(".")[0] == "kfp" for n in names)


def top_level_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def test_components_import_flashdraft_only_inside_their_bodies_and_pipelines_only_components():
    components = sorted((ROOT / "components").glob("*/component.py"))
    assert len(components) >= 5
    for path in components:
        assert not any(m.split(".")[0] == "flashdraft" for m in top_level_imports(path)), path
    for path in sorted((ROOT / "pipelines").glob("*.py")):
        imported = {m for node in ast.walk(ast.parse(path.read_text())) for m in _names(node)}
        assert not any(m.split(".")[0] == "flashdraft" for m in imported), f"{path} imports flashdraft"


def _names(node):
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.module:
        return [node.module]
    return []


def test_the_walker_sees_a_violation(tmp_path):
    # The rule is only as good as the walker: a low-layer file importing upward must be caught.
    fake = SRC / "model" / "_layering_probe.py"
    fake.write_text("def f():\n    from flashdraft import registry\n    import mlflow\n")
    try:
        assert "flashdraft.tracking.registry" in imported_modules(fake)
        assert layer(module_name(fake)) == MODEL < layer("flashdraft.tracking.registry")
    finally:
        fake.unlink()
