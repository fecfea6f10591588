"""`flashdraft submit PIPELINE.py --host URL --experiment NAME [name=value ...]`: compile a pipeline file and
create a run on a Kubeflow Pipelines server. With `stages/run.py`, the Kubeflow edge (imports kfp)."""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import urlparse

import yaml

from flashdraft.errors import UserError
from flashdraft.files import check_output_file, write_text
from flashdraft.launch.job_spec import check_quantity
from flashdraft.stages.run import check_config_arguments, compiled_yaml, load_pipeline, parse_arguments


def without_caching(package: str) -> str:
    """A compiled pipeline with caching off on every task, nested DAGs included (kfp.Client's own
    `enable_caching` override reaches only the top-level tasks, not those inside an exit handler)."""
    documents = list(yaml.safe_load_all(package))
    spec = documents[0]
    dags = [spec["root"].get("dag", {})] + [c["dag"] for c in spec.get("components", {}).values() if "dag" in c]
    for dag in dags:
        for task in dag.get("tasks", {}).values():
            task["cachingOptions"] = {"enableCache": False}
    return yaml.safe_dump_all(documents, sort_keys=False)


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
    output: str | Path | None = None,
):
    """Compile the pipeline and create a run on the Kubeflow Pipelines server at `host`.

    `cache=False` runs every step afresh; with True, steps cache as compiled (evaluation, promotion and
    the MLflow steps never do). `output`: also write the compiled pipeline there (as compiled).
    """
    import kfp
    from kfp_server_api.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    url = urlparse(host)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise UserError(f"--host {host!r} is not an http(s) URL; give the Kubeflow Pipelines API endpoint, e.g. "
                        "http://ml-pipeline-ui.kubeflow:80 or https://kubeflow.example.com/pipeline")
    _, pipeline = load_pipeline(path, env)
    arguments = parse_arguments(pipeline, items)
    check_config_arguments(pipeline, arguments)
    if output:
        output = check_output_file(output, "--output")
    package = compiled_yaml(pipeline)
    if output:
        write_text(output, package)
    with tempfile.TemporaryDirectory() as tmp:
        package_path = write_text(Path(tmp) / "pipeline.yaml", package if cache else without_caching(package))
        try:
            client = kfp.Client(host=host, namespace=namespace)
            return client.create_run_from_pipeline_package(
                str(package_path),
                arguments=arguments,
                run_name=run_name,
                experiment_name=experiment,
                namespace=namespace,
                service_account=service_account,
            )
        except (HTTPError, OSError) as err:
            raise UserError(f"cannot reach the Kubeflow Pipelines API at {host} ({type(err).__name__}): check "
                            "--host (a port-forward or ingress to ml-pipeline) and that the server is up") from err
        except ApiException as err:
            raise UserError(f"the Kubeflow Pipelines API at {host} refused the run: HTTP {err.status} "
                            f"{err.reason}; {str(err.body or '')[:300]}") from err


def _compile_env(args: argparse.Namespace) -> dict[str, str]:
    env = {}
    if args.workspace_size:
        check_quantity(args.workspace_size, "--workspace-size")
        env["FLASHDRAFT_WORKSPACE_SIZE"] = args.workspace_size
    if args.storage_class:
        env["FLASHDRAFT_STORAGE_CLASS"] = args.storage_class
    return env


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pipeline", type=Path, help="pipeline file, e.g. pipelines/dflash_nano30b.py")
    parser.add_argument("arguments", nargs="*", metavar="name=value", help="pipeline parameters")
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


def main(args: argparse.Namespace) -> int:
    result = submit(args.pipeline, args.arguments, host=args.host, experiment=args.experiment,
                    run_name=args.run_name, namespace=args.namespace, service_account=args.service_account,
                    cache=args.cache, env=_compile_env(args), output=args.output)
    print(f"submitted run {result.run_id} to {args.host} (experiment {args.experiment})")
    return 0
