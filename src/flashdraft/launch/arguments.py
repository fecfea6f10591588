"""The arguments of a launched `flashdraft train` (or `warmup`): the recipe, and every value in which the
config differs from it as a `key=value` override, so that the launched command rebuilds the same config.

The launch section stays behind (it describes where the command runs, not what it does), and the output
dir is the launcher's to choose: it comes last.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml

from flashdraft.config import RECIPES_DIR, Config, load_config, recipe_path, to_dict

# The config key of each launchable command's output folder.
OUTPUT_DIR_KEYS = {"train": "train.output_dir", "warmup": "warmup.output_dir"}


def yaml_value(value: Any) -> str:
    """A value as `key=value` text that `parse_overrides` (YAML) reads back as the same value."""
    if isinstance(value, float) and math.isfinite(value):
        text = repr(value)
        # PyYAML reads "1e-05" as a string; it needs a dot in the mantissa.
        if "e" in text and "." not in text.split("e")[0]:
            mantissa, exp = text.split("e")
            text = f"{mantissa}.0e{exp}"
        return text
    return yaml.safe_dump(value, default_flow_style=True, width=math.inf).strip().removesuffix("...").strip()


def _trainer_values(config: Config) -> dict[str, Any]:
    # Not config.flatten: that one writes MLflow params (lists as JSON text, dict fields split into
    # keys), while an override carries one config key's typed value whole.
    return {
        f"{section}.{key}": value
        for section, fields in to_dict(config).items()
        if isinstance(fields, dict) and section != "launch"
        for key, value in fields.items()
    }


def changed_values(config: Config, recipe: str | None) -> dict[str, Any]:
    """{"section.key": value} where `config` differs from `recipe` (None: the defaults), launch aside."""
    base = _trainer_values(load_config(recipe))
    return {key: value for key, value in _trainer_values(config).items() if value != base[key]}


def _portable_recipe(recipe: str | None) -> str | None:
    """The recipe as a trainer on another machine can load it: a packaged one by name, a file: None."""
    if recipe is None:
        return None
    path = recipe_path(recipe)
    if path.resolve().parent != RECIPES_DIR.resolve():
        return None
    return path.stem if Path(recipe).suffix else recipe


def command_arguments(config: Config, output_dir: str, *, portable: bool) -> list[str]:
    """`flashdraft <launch.command> ...`: the command and the arguments that rebuild `config` (launch
    section aside) writing to `output_dir`.

    `portable`: for a process on another machine (a pod), where a recipe file of this machine does not
    exist: its values travel as overrides instead of its path.
    """
    key = OUTPUT_DIR_KEYS[config.launch.command]
    recipe = _portable_recipe(config.recipe) if portable else config.recipe
    overrides = [f"{name}={yaml_value(value)}" for name, value in changed_values(config, recipe).items() if name != key]
    return [config.launch.command, *(["--config", recipe] if recipe else []), *overrides, f"{key}={output_dir}"]
