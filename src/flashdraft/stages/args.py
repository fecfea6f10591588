"""The command-line face of a config-driven stage: `--config RECIPE`, flags that alias config keys, and
`key=value` overrides, turned into one validated `Config`.

Precedence: defaults < recipe < flags < key=value overrides. A flag is only a shorter spelling of one
config key (`--target X` is `target.name_or_path=X`), so the recipe can set everything a flag can.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from flashdraft.config import Config, load_config
from flashdraft.errors import UserError

_PREFIX = "flag:"


@dataclass(frozen=True)
class Flag:
    """`name` sets config `key`; `options` go to argparse (type, nargs, choices, action, const, ...)."""

    name: str
    key: str
    help: str
    options: dict[str, Any] = field(default_factory=dict)


def on_off(text: str) -> bool:
    if text not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"expected on or off, got {text!r}")
    return text == "on"


def comma_ints(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def add_config_arguments(parser: argparse.ArgumentParser, flags: Sequence[Flag] = ()) -> None:
    parser.add_argument("--config", metavar="RECIPE",
                        help="recipe name (e.g. smollm2_135m) or YAML file; any config section may be set there")
    for flag in flags:
        options = dict(flag.options)
        if options.get("action") is None:
            options.setdefault("metavar", flag.key.rpartition(".")[2].upper())
        parser.add_argument(flag.name, dest=_PREFIX + flag.key, default=argparse.SUPPRESS,
                            help=f"{flag.help} (= {flag.key})", **options)
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="config overrides, e.g. train.max_steps=100 data.train=chats.jsonl")


def config_from_args(args: argparse.Namespace) -> Config:
    given = {name[len(_PREFIX):]: value for name, value in vars(args).items() if name.startswith(_PREFIX)}
    return load_config(args.config, args.overrides, given)


def require(value: Any, key: str, flag: str | None = None) -> Any:
    """`value`, or a UserError naming the config key (and its flag) that must be set."""
    if value is None or value == "":
        spelled = f"{flag} or {key}=..." if flag else f"{key}=..."
        raise UserError(f"{key} is not set; give it with {spelled} (or in the recipe)")
    return value
