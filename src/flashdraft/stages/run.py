"""`flashdraft run` and `flashdraft submit`: a pipeline file run on this machine, or sent to Kubeflow.

The only flashdraft module that imports kfp (inside functions, so the library works without it).

    flashdraft run pipelines/dflash_nano30b.py --local [name=value ...]
        runs the pipeline's DAG with kfp's local SubprocessRunner, using the pipeline module's
        `PROFILES["local"]` arguments (then yours), and prints the result.
    flashdraft submit pipelines/dflash_nano30b.py --host URL --experiment NAME [name=value ...]
        compiles the pipeline and creates a run on a Kubeflow Pipelines server.
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
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from flashdraft.tracking import runs as tracking
from flashdraft.errors import UserError

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
            raise UserError(f"argument {name}={raw!r} is not valid YAML: {err}") from err
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise UserError(f"argument {name}={raw!r}: expected {expected.__name__}")
        out[name] = value
    return out


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


def compile_pipeline(path: str | Path, output: str | Path, env: Mapping[str, str] | None = None) -> Path:
    from kfp import compiler

    _, pipeline = load_pipeline(path, env)
    output = Path(output)
    compiler.Compiler().compile(pipeline, str(output))
    return output


def disable_caching(package: Path) -> None:
    """Turn caching off on every task of a compiled pipeline, nested DAGs included (kfp.Client's own
    `enable_caching` override reaches only the top-level tasks, not those inside an exit handler)."""
    documents = list(yaml.safe_load_all(package.read_text()))
    spec = documents[0]
    dags = [spec["root"].get("dag", {})] + [c["dag"] for c in spec.get("components", {}).values() if "dag" in c]
    for dag in dags:
        for task in dag.get("tasks", {}).values():
            task["cachingOptions"] = {"enableCache": False}
    package.write_text(yaml.safe_dump_all(documents, sort_keys=False))


def submit(
    path: str | Path,
    items: Sequence[str] = (),
    *,
    host: str,
    experiment: str,
    run_name: str | None = None,
    namespace: str | None = None,
    service_account: str | None = None,
    cache: bool = True,
    env: Mapping[str, str] | None = None,
):
    """Compile the pipeline and create a run on the Kubeflow Pipelines server at `host`.

    `cache=False` runs every step afresh; with True, steps cache as compiled (evaluation, promotion and
    the MLflow steps never do).
    """
    import kfp

    _, pipeline = load_pipeline(path, env)
    arguments = parse_arguments(pipeline, items)
    client = kfp.Client(host=host, namespace=namespace)
    with tempfile.TemporaryDirectory() as tmp:
        package = Path(tmp) / "pipeline.yaml"
        compile_pipeline(path, package, env)
        if not cache:
            disable_caching(package)
        return client.create_run_from_pipeline_package(
            str(package),
            arguments=arguments,
            run_name=run_name,
            experiment_name=experiment,
            namespace=namespace,
            service_account=service_account,
        )


def _number(value: Any) -> str:
    try:
        return f"{float(value):.3f}"
    except (TypeError, ValueError):
        return "?"


def ui_hint(tracking_uri: str) -> str:
    if tracking_uri.startswith(("http://", "https://")):
        return f"open {tracking_uri} in a browser"
    return f"mlflow ui --backend-store-uri {tracking_uri}   (then open http://127.0.0.1:5000)"


def _compile_env(args: argparse.Namespace) -> dict[str, str]:
    env = {}
    if args.workspace_size:
        env["FLASHDRAFT_WORKSPACE_SIZE"] = args.workspace_size
    if args.storage_class:
        env["FLASHDRAFT_STORAGE_CLASS"] = args.storage_class
    return env


def _collect_pairs_after_options(parser: argparse.ArgumentParser) -> None:
    """Accept `name=value` after options too (`run x.py --local a=1`): argparse fills a `*` positional
    only from the first run of positionals, so later pairs come back as extras; take them here."""
    parse_known_args = parser.parse_known_args

    def parse(args=None, namespace=None):
        namespace, extras = parse_known_args(args, namespace)
        pairs = [item for item in extras if "=" in item and not item.startswith("-")]
        namespace.arguments = [*namespace.arguments, *pairs]
        return namespace, [item for item in extras if item not in pairs]

    parser.parse_known_args = parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # One module serves both commands (it is the only one allowed to import kfp).
    parser.add_argument("pipeline", type=Path, help="pipeline file, e.g. pipelines/dflash_nano30b.py")
    parser.add_argument("arguments", nargs="*", metavar="name=value", help="pipeline parameters")
    _collect_pairs_after_options(parser)
    if parser.prog.split()[-1] == "run":
        parser.add_argument("--local", action="store_true", required=True,
                            help="run here with kfp's local runner (the only place `run` runs)")
        parser.add_argument("--profile", default="local",
                            help="the pipeline's argument profile (default %(default)s; 'none': its defaults)")
        parser.add_argument("--pipeline-root", default="flashdraft-runs", help="where step outputs are kept")
        return
    parser.add_argument("--host", required=True, help="Kubeflow Pipelines API endpoint")
    parser.add_argument("--experiment", required=True, help="KFP experiment name (created if missing)")
    parser.add_argument("--run-name", help="KFP run name")
    parser.add_argument("--namespace", help="Kubeflow profile namespace (multi-user installs)")
    parser.add_argument("--service-account", help="service account the run's pods use")
    parser.add_argument("--no-cache", dest="cache", action="store_false",
                        help="run every step afresh (default: steps cache as compiled; evaluate and promote never do)")
    parser.add_argument("--workspace-size", help="size of the run's workspace volume (default: the pipeline's)")
    parser.add_argument("--storage-class", help="storage class of the workspace volume (RWX)")
    parser.add_argument("--output", type=Path, help="also write the compiled pipeline YAML here")


def run(args: argparse.Namespace) -> int:
    if args.command == "submit":
        env = _compile_env(args)
        if args.output:
            compile_pipeline(args.pipeline, args.output, env)
        result = submit(args.pipeline, args.arguments, host=args.host, experiment=args.experiment,
                        run_name=args.run_name, namespace=args.namespace, service_account=args.service_account,
                        cache=args.cache, env=env)
        print(f"submitted run {result.run_id} to {args.host} (experiment {args.experiment})")
        return 0
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
