"""The `flashdraft` command line: one sub-command per pipeline step, each implemented in its own module.

Every command module exposes `add_arguments(parser)` and `run(args) -> int`. A `UserError` from a
command becomes one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from flashdraft.errors import UserError

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "draft-init": ("flashdraft.stages.draft_init", "write a fresh DFlash draft checkpoint for a target"),
    "train": ("flashdraft.stages.train", "train a draft against the frozen target (alone or under torchrun)"),
    "dllm-evaluate": ("flashdraft.stages.dllm_evaluate", "held-out masked-token loss/accuracy and a sample of a diffusion LM"),
    "warmup": ("flashdraft.stages.warmup", "materialise and check the target, regenerate training answers with it"),
    "launch": ("flashdraft.stages.launch", "run training as a PyTorchJob or TrainJob on Kubernetes"),
    "evaluate": ("flashdraft.stages.evaluate", "tau, speedup and losslessness of a draft on benchmarks, with baselines"),
    "promote": ("flashdraft.stages.promote", "register a trained draft in MLflow and move champion/challenger by policy"),
    "run": ("flashdraft.stages.run", "run a pipeline file here with kfp's local runner (--local)"),
    "submit": ("flashdraft.stages.run", "compile a pipeline file and create a run on Kubeflow Pipelines"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flashdraft", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        command.set_defaults(_module=module)
        importlib.import_module(module).add_arguments(command)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return importlib.import_module(args._module).run(args)
    except UserError as err:
        print(f"flashdraft {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
