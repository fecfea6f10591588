"""The `flashdraft` command line: `flashdraft STAGE [options]`, each stage a module of `flashdraft.stages`.

A stage module exposes `add_arguments(parser)` and `main(args) -> int`. A `UserError` becomes one line
on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from flashdraft.errors import UserError
from flashdraft.stages import STAGES


def stage_parser(name: str) -> tuple[argparse.ArgumentParser, object]:
    module_name, help_text = STAGES[name]
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(prog=f"flashdraft {name}", description=help_text)
    module.add_arguments(parser)
    return parser, module


def main(argv: list[str] | None = None) -> int:
    top = argparse.ArgumentParser(
        prog="flashdraft",
        description=__doc__.splitlines()[0],
        epilog="stages:\n" + "\n".join(f"  {name:<14} {help_text}" for name, (_, help_text) in STAGES.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    top.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    top.add_argument("command", choices=STAGES, metavar="STAGE", help="one of the stages below")
    top.add_argument("arguments", nargs=argparse.REMAINDER, help="the stage's options (flashdraft STAGE --help)")
    chosen = top.parse_args(argv)
    parser, module = stage_parser(chosen.command)
    # Intermixed: `key=value` pairs may come before, between or after the options.
    args = parser.parse_intermixed_args(chosen.arguments)
    logging.basicConfig(
        level=logging.DEBUG if chosen.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return module.main(args)
    except UserError as err:
        print(f"flashdraft {chosen.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
