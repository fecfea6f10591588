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

from flashdraft.config import load_config  # noqa: E402
from flashdraft.stages import run as run_stage  # noqa: E402
from flashdraft.errors import UserError  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
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
    path = run_stage.compile_pipeline(PIPELINE, tmp_path_factory.mktemp("c") / "p.yaml")
    pipeline_spec, platform_spec = yaml.safe_load_all(path.read_text())
    return pipeline_spec, platform_spec["platforms"]["kubernetes"]["deploymentSpec"]["executors"]


def dag(pipeline_spec, component):
    return pipeline_spec["components"][component]["dag"]["tasks"]


def test_seed_recipe_defaults(compiled):
    pipeline_spec, _ = compiled
    params = pipeline_spec["root"]["inputDefinitions"]["parameters"]
    assert params["target"]["defaultValue"] == "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"
    assert params["gpus"]["defaultValue"] == 8
    # Every step setting comes from the recipe, overridable per key (no "0 = default" sentinels).
    assert params["overrides"]["defaultValue"] == []
    assert not {"max_length", "num_anchors", "warmup_num_samples", "eval_num_prompts", "benchmarks"} & set(params)
    recipe = load_config(params["recipe"]["defaultValue"])
    assert (recipe.data.max_length, recipe.objective.num_anchors) == (4096, 512)
    assert (recipe.warmup.temperature, recipe.warmup.max_length, recipe.warmup.max_new_tokens) == (0.8, 4096, 4096)
    assert params["prompts"]["defaultValue"] == [f"nvidia/Nemotron-Post-Training-Dataset-v2:{s}"
                                                for s in ("chat", "math", "code")]
    assert params["launcher"]["defaultValue"] == "pytorchjob"
    root = pipeline_spec["root"]["dag"]["tasks"]
    assert root["mlflow-run-end"]["triggerPolicy"]["strategy"] == "ALL_UPSTREAM_TASKS_COMPLETED"


def test_dag_order_and_caching(compiled):
    pipeline_spec, _ = compiled
    body = dag(pipeline_spec, "comp-exit-handler-1")
    # draft-init and warmup have no edge between them (parallel); training waits for both.
    assert "draft-init" not in body["target-warmup"].get("dependentTasks", [])
    assert "target-warmup" in body["prepare-data"]["dependentTasks"]  # tokenised on a CPU node, before training
    assert set(body["condition-branches-2"]["dependentTasks"]) >= {"draft-init", "target-warmup", "prepare-data"}
    branches = dag(pipeline_spec, "comp-condition-branches-2")
    assert branches["condition-3"]["triggerPolicy"]["condition"].endswith("== 'local'")
    for component, suffix in (("comp-condition-3", ""), ("comp-condition-4", "-2")):
        tasks = dag(pipeline_spec, component)
        assert tasks[f"evaluate{suffix}"]["dependentTasks"] == [f"train{suffix}"]
        assert set(tasks[f"promote{suffix}"]["dependentTasks"]) == {f"train{suffix}", f"evaluate{suffix}"}
        for name in ("evaluate", "promote"):
            assert tasks[f"{name}{suffix}"]["cachingOptions"] == {}, name  # {}: enableCache false
        assert tasks[f"train{suffix}"]["cachingOptions"] == {"enableCache": True}
    assert dag(pipeline_spec, "comp-condition-3")["train"]["retryPolicy"]["maxRetryCount"] == 2
    for name in ("mlflow-run-start", "target-warmup"):
        assert body[name]["cachingOptions"] == {}, name


def test_kubernetes_wiring(compiled):
    pipeline_spec, executors = compiled
    containers = pipeline_spec["deploymentSpec"]["executors"]
    # launcher=local: the train step's pod holds `gpus` GPUs; a launched job's step holds none.
    gpus = containers["exec-train"]["container"]["resources"]["accelerator"]
    assert gpus["resourceType"] == "nvidia.com/gpu" and "gpus" in str(gpus["resourceCount"])
    assert "resources" not in containers["exec-train-2"]["container"]
    assert executors["exec-train-2"]["pvcMount"][0]["pvcNameParameter"]["componentInputParameter"].endswith("data_pvc")
    train = executors["exec-train"]
    secrets = {s["secretNameParameter"]["componentInputParameter"] for s in train["secretAsEnv"]}
    assert secrets == {"pipelinechannel--hf_token_secret", "pipelinechannel--mlflow_secret"}
    assert all(s["optional"] for s in train["secretAsEnv"])
    assert train["nodeSelector"]["nodeSelectorJson"]["componentInputParameter"].endswith("node_selector")
    assert train["tolerations"][0]["tolerationJson"]["componentInputParameter"].endswith("tolerations")
    assert train["emptyDirMounts"][0]["mountPath"] == "/dev/shm"
    assert "nodeSelector" not in executors["exec-promote"]  # the registry step needs no GPU node
    assert "nodeSelector" not in executors["exec-prepare-data"]  # nor does tokenising
    assert executors["exec-evaluate"]["nodeSelector"]
    # Every step's pod runs as the images' non-root user.
    steps = [name for name in containers if name.startswith("exec-")]
    assert len(steps) >= 9
    for name in steps:
        assert executors[name]["securityContext"] == {"runAsUser": "1000", "runAsNonRoot": True}, name


def test_checked_in_pipeline_declares_the_workspace_volume():
    _, platform = yaml.safe_load_all(PIPELINE.with_suffix(".yaml").read_text())
    workspace = platform["platforms"]["kubernetes"]["pipelineConfig"]["workspace"]
    assert workspace["size"] == "300Gi"
    assert workspace["kubernetes"]["pvcSpecPatch"] == {"accessModes": ["ReadWriteMany"]}


def test_workspace_size_and_storage_class_are_compile_time_settings(tmp_path):
    path = run_stage.compile_pipeline(PIPELINE, tmp_path / "p.yaml",
                                        env={"FLASHDRAFT_WORKSPACE_SIZE": "2Ti", "FLASHDRAFT_STORAGE_CLASS": "rwx"})
    _, platform = yaml.safe_load_all(path.read_text())
    workspace = platform["platforms"]["kubernetes"]["pipelineConfig"]["workspace"]
    assert workspace["size"] == "2Ti"
    assert workspace["kubernetes"]["pvcSpecPatch"] == {"accessModes": ["ReadWriteMany"], "storageClassName": "rwx"}


def test_arguments_are_typed_and_checked():
    _, pipeline = run_stage.load_pipeline(PIPELINE)
    args = run_stage.parse_arguments(pipeline, ["gpus=4", "min_tau_gain=1", "tolerations=[]",
                                                  "node_selector={pool: h200}", "target=org/model"])
    assert args == {"gpus": 4, "min_tau_gain": 1.0, "tolerations": [], "node_selector": {"pool": "h200"},
                    "target": "org/model"}
    with pytest.raises(UserError, match="no parameter 'gpu'.*gpus"):
        run_stage.parse_arguments(pipeline, ["gpu=4"])
    with pytest.raises(UserError, match="expected int"):
        run_stage.parse_arguments(pipeline, ["gpus=four"])
    with pytest.raises(UserError, match="name=value"):
        run_stage.parse_arguments(pipeline, ["gpus"])
