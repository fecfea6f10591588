"""`flashdraft run PIPELINE.py --local [name=value ...]`: a pipeline file's DAG run on this machine with kfp's
local SubprocessRunner, using the pipeline module's `PROFILES["local"]` arguments (then yours).

The Kubeflow edge: with `stages/submit.py`, the only flashdraft modules that import kfp (inside
functions, so the library works without it). Also home of what both commands share: loading a
pipeline file, its `name=value` arguments, compiling it.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import logging
import os
import sys
import tempfile
import traceback
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from flashdraft.config import load_config, redact, yaml_problem
from flashdraft.errors import UserError
from flashdraft.files import check_output_file, write_text
from flashdraft.tracking import runs as tracking

log = logging.getLogger(__name__)

# kfp's parameter types -> how a `name=value` string is read.
_PARSED_TYPES = {"Integer": int, "Float": float, "Boolean": bool, "List": list, "Dict": dict}
_module_ids = itertools.count()


def load_pipeline(path: str | Path, env: Mapping[str, str] | None = None):
    """Import a pipeline file and return (module, pipeline). `env` is set while it imports: some
    settings (image names, workspace size) are read at import time."""
    path = Path(path)
    if not path.is_file() or path.suffix != ".py":
        raise UserError(f"pipeline file {path} does not exist or is not a .py file; e.g. pipelines/dflash_nano30b.py")
    from kfp.dsl.graph_component import GraphComponent

    saved = {key: os.environ.get(key) for key in env or {}}
    os.environ.update(env or {})
    try:
        spec = importlib.util.spec_from_file_location(f"flashdraft_pipeline_{next(_module_ids)}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except UserError:
        raise
    except SyntaxError as err:
        raise UserError(f"pipeline file {path} line {err.lineno}: {err.msg}") from None
    except Exception as err:  # the user's file: whatever it raises, name it and where
        lines = [frame.lineno for frame in traceback.extract_tb(err.__traceback__) if frame.filename == str(path)]
        where = f" line {lines[-1]}" if lines else ""
        raise UserError(f"pipeline file {path}{where} failed to import: {type(err).__name__}: {err}") from None
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    pipelines = [value for value in vars(module).values() if isinstance(value, GraphComponent)]
    if len(pipelines) != 1:
        raise UserError(f"{path} must define exactly one @dsl.pipeline function, found {len(pipelines)}")
    return module, pipelines[0]


def parameter_types(pipeline) -> dict[str, str]:
    return {name: spec.type for name, spec in pipeline.component_spec.inputs.items()}


def parse_arguments(pipeline, items: Sequence[str]) -> dict[str, Any]:
    """`name=value` strings -> pipeline arguments; non-string values are read as YAML (3, 0.1, [a, b], {k: v})."""
    types = parameter_types(pipeline)
    out: dict[str, Any] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep or not name:
            raise UserError(f"argument {item!r} is not of the form name=value (e.g. gpus=4)")
        if name not in types:
            raise UserError(f"the pipeline has no parameter {name!r}; its parameters: {', '.join(sorted(types))}")
        expected = _PARSED_TYPES.get(types[name])
        if expected is None:
            out[name] = raw
            continue
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as err:
            raise UserError(f"argument {name}={raw!r} is not valid YAML: {yaml_problem(err)}") from None
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise UserError(f"argument {name}={raw!r}: expected {expected.__name__}")
        out[name] = value
    return out


def check_config_arguments(pipeline, arguments: Mapping[str, Any]) -> None:
    """The recipe and overrides a run would pass to every step, validated here: a typo fails now, not in a
    step after the earlier ones ran."""
    inputs = pipeline.component_spec.inputs
    if "recipe" not in inputs:
        return
    value = {name: arguments.get(name, getattr(inputs.get(name), "default", None)) for name in ("recipe", "overrides")}
    load_config(value["recipe"], value["overrides"] or [])


def run_local(
    path: str | Path,
    items: Sequence[str] = (),
    *,
    profile: str | None = "local",
    pipeline_root: str | Path = "flashdraft-runs",
) -> dict[str, Any]:
    """Run the pipeline's DAG here with kfp's SubprocessRunner; returns the pipeline's JSON output.

    MLflow: `MLFLOW_TRACKING_URI`, else ./mlflow.db. Raises RuntimeError naming the failed step.
    """
    from kfp import local

    # Our images are not named "python"; on this machine the steps run in this environment anyway.
    warnings.filterwarnings("ignore", message="You may be attemping to run a task", category=RuntimeWarning)
    module, pipeline = load_pipeline(path)
    profiles = getattr(module, "PROFILES", {})
    if profile and profile not in profiles:
        raise UserError(f"{path} has no profile {profile!r}; its profiles: {', '.join(profiles) or 'none'}")
    arguments = {**(profiles[profile] if profile else {}), **parse_arguments(pipeline, items)}
    check_config_arguments(pipeline, arguments)
    os.environ["MLFLOW_TRACKING_URI"] = tracking.default_tracking_uri()
    if "mlflow_tracking_uri" in parameter_types(pipeline) and "mlflow_tracking_uri" not in arguments:
        arguments["mlflow_tracking_uri"] = os.environ["MLFLOW_TRACKING_URI"]
    # kfp deletes the workspace root after every run: give it a fresh folder of its own.
    workspace = tempfile.mkdtemp(prefix="flashdraft-workspace-")
    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(Path(pipeline_root).resolve()),
        workspace_root=workspace,
        raise_on_error=True,
    )
    log.info("running %s locally with %s", pipeline.name, json.dumps(arguments))
    task = pipeline(**arguments)
    return json.loads(task.output) if isinstance(task.output, str) else {"output": task.output}


def compiled_yaml(pipeline) -> str:
    """The pipeline compiled to its YAML package text."""
    from kfp import compiler

    with tempfile.TemporaryDirectory() as tmp:
        package = Path(tmp) / "pipeline.yaml"  # kfp picks the format by the suffix
        compiler.Compiler().compile(pipeline, str(package))
        return package.read_text()


def compile_pipeline(path: str | Path, output: str | Path, env: Mapping[str, str] | None = None) -> Path:
    """Compile the pipeline file `path` to `output` (written atomically)."""
    output = check_output_file(output, "output")
    _, pipeline = load_pipeline(path, env)
    return write_text(output, compiled_yaml(pipeline))


def _number(value: Any) -> str:
    try:
        return f"{float(value):.3f}"
    except (TypeError, ValueError):
        return "?"


def ui_hint(tracking_uri: str) -> str:
    tracking_uri = redact(tracking_uri)
    if tracking_uri.startswith(("http://", "https://")):
        return f"open {tracking_uri} in a browser"
    return f"mlflow ui --backend-store-uri {tracking_uri}   (then open http://127.0.0.1:5000)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pipeline", type=Path, help="pipeline file, e.g. pipelines/dflash_nano30b.py")
    parser.add_argument("arguments", nargs="*", metavar="name=value", help="pipeline parameters")
    parser.add_argument("--local", action="store_true", required=True,
                        help="run here with kfp's local runner (the only place `run` runs)")
    parser.add_argument("--profile", default="local",
                        help="the pipeline's argument profile (default %(default)s; 'none': its defaults)")
    parser.add_argument("--pipeline-root", default="flashdraft-runs", help="where step outputs are kept")


def main(args: argparse.Namespace) -> int:
    profile = None if args.profile == "none" else args.profile
    try:
        summary = run_local(args.pipeline, args.arguments, profile=profile, pipeline_root=args.pipeline_root)
    except RuntimeError as err:
        print(f"flashdraft run: pipeline failed: {err}", file=sys.stderr)
        return 1
    uri = summary.get("tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI", "")
    lines = [
        "",
        f"pipeline {summary.get('state', '?')}: MLflow run {summary.get('run_id', '?')}",
        f"  {summary.get('primary_benchmark', 'primary')} tau {_number(summary.get('tau'))}, "
        f"speedup {_number(summary.get('speedup'))}x",
        f"  registered {summary.get('model_name', '?')} version {summary.get('model_version', '?')} "
        f"-> @{summary.get('alias', '?')} ({summary.get('decision', '')})",
        f"  MLflow UI: {ui_hint(uri)}",
        f"  step outputs: {Path(args.pipeline_root).resolve()}",
    ]
    print("\n".join(lines))
    return 0
