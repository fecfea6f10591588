"""Every component and pipeline compiles, the checked-in YAML equals a fresh compile, and the compiled
pipeline carries the Kubernetes wiring (GPUs, secrets, scheduling, caching) a cluster run needs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("kfp")

from kfp import components  # noqa: E402

from flashdraft import orchestrate  # noqa: E402
from flashdraft.errors import UserError  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PIPELINE = ROOT / "pipelines" / "dflash_nano30b.py"


def test_checked_in_yaml_equals_a_fresh_compile():
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("FLASHDRAFT_")}
    result = subprocess.run([sys.executable, str(ROOT / "pipelines" / "compile_all.py"), "--check"],
                            capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stdout + result.stderr


def test_compiled_components_load_back_with_their_interfaces():
    names = ["draft_init", "target_warmup", "train", "evaluate", "promote", "mlflow_run_start", "mlflow_run_end"]
    for name in names:
        component = components.load_component_from_file(str(ROOT / "components" / name / "component.yaml"))
        assert component.name == name.replace("_", "-")
    train = components.load_component_from_file(str(ROOT / "components" / "train" / "component.yaml"))
    assert {"init_draft", "dataset", "nproc_per_node", "launcher"} <= set(train.component_spec.inputs)
    assert {"draft", "metrics"} <= set(train.component_spec.outputs)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    path = orchestrate.compile_pipeline(PIPELINE, tmp_path_factory.mktemp("c") / "p.yaml")
    pipeline_spec, platform_spec = yaml.safe_load_all(path.read_text())
    return pipeline_spec, platform_spec["platforms"]["kubernetes"]["deploymentSpec"]["executors"]


def tasks(pipeline_spec):
    return pipeline_spec["components"]["comp-exit-handler-1"]["dag"]["tasks"]


def test_seed_recipe_defaults(compiled):
    pipeline_spec, _ = compiled
    params = pipeline_spec["root"]["inputDefinitions"]["parameters"]
    assert params["target"]["defaultValue"] == "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"
    assert params["gpus"]["defaultValue"] == 8
    assert params["max_length"]["defaultValue"] == 4096 and params["num_anchors"]["defaultValue"] == 512
    assert params["prompts"]["defaultValue"] == [f"nvidia/Nemotron-Post-Training-Dataset-v2:{s}"
                                                for s in ("chat", "math", "code")]
    assert pipeline_spec["root"]["dag"]["tasks"]["mlflow-run-end"]["triggerPolicy"]["strategy"] == "ALL_UPSTREAM_TASKS_COMPLETED"


def test_dag_order_and_caching(compiled):
    pipeline_spec, _ = compiled
    dag = tasks(pipeline_spec)
    assert set(dag["train"]["dependentTasks"]) >= {"draft-init", "target-warmup"}
    assert "train" in dag["evaluate"]["dependentTasks"]
    assert set(dag["promote"]["dependentTasks"]) >= {"train", "evaluate"}
    for name in ("evaluate", "promote", "mlflow-run-start"):
        assert dag[name]["cachingOptions"] == {}, name  # caching off: {} means enableCache false
    assert dag["train"]["cachingOptions"] == {"enableCache": True}
    assert dag["train"]["retryPolicy"]["maxRetryCount"] == 2


def test_kubernetes_wiring(compiled):
    pipeline_spec, executors = compiled
    train = executors["exec-train"]
    gpus = pipeline_spec["deploymentSpec"]["executors"]["exec-train"]["container"]["resources"]["accelerator"]
    assert gpus["resourceType"] == "nvidia.com/gpu" and "gpus" in str(gpus["resourceCount"])
    secrets = {s["secretNameParameter"]["componentInputParameter"] for s in train["secretAsEnv"]}
    assert secrets == {"pipelinechannel--hf_token_secret", "pipelinechannel--mlflow_secret"}
    assert all(s["optional"] for s in train["secretAsEnv"])
    assert train["nodeSelector"]["nodeSelectorJson"]["componentInputParameter"].endswith("node_selector")
    assert train["tolerations"][0]["tolerationJson"]["componentInputParameter"].endswith("tolerations")
    assert train["emptyDirMounts"][0]["mountPath"] == "/dev/shm"
    assert "nodeSelector" not in executors["exec-promote"]  # the registry step needs no GPU node
    assert pipeline_spec["root"]["dag"]["tasks"]  # and the workspace volume is declared:
    workspace = yaml.safe_load(PIPELINE.with_suffix(".yaml").read_text().split("\n---\n")[1])
    assert workspace["platforms"]["kubernetes"]["pipelineConfig"]["workspace"]["size"] == "300Gi"


def test_workspace_size_and_storage_class_are_compile_time_settings(tmp_path):
    path = orchestrate.compile_pipeline(PIPELINE, tmp_path / "p.yaml",
                                        env={"FLASHDRAFT_WORKSPACE_SIZE": "2Ti", "FLASHDRAFT_STORAGE_CLASS": "rwx"})
    _, platform = yaml.safe_load_all(path.read_text())
    workspace = platform["platforms"]["kubernetes"]["pipelineConfig"]["workspace"]
    assert workspace["size"] == "2Ti"
    assert workspace["kubernetes"]["pvcSpecPatch"] == {"accessModes": ["ReadWriteMany"], "storageClassName": "rwx"}


def test_arguments_are_typed_and_checked():
    _, pipeline = orchestrate.load_pipeline(PIPELINE)
    args = orchestrate.parse_arguments(pipeline, ["gpus=4", "min_tau_gain=1", "tolerations=[]",
                                                  "node_selector={pool: h200}", "target=org/model"])
    assert args == {"gpus": 4, "min_tau_gain": 1.0, "tolerations": [], "node_selector": {"pool": "h200"},
                    "target": "org/model"}
    with pytest.raises(UserError, match="no parameter 'gpu'.*gpus"):
        orchestrate.parse_arguments(pipeline, ["gpu=4"])
    with pytest.raises(UserError, match="expected int"):
        orchestrate.parse_arguments(pipeline, ["gpus=four"])
    with pytest.raises(UserError, match="name=value"):
        orchestrate.parse_arguments(pipeline, ["gpus"])
