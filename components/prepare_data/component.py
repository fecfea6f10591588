"""Component: tokenise the training data on a CPU, into the cache the trainer reads (`flashdraft prepare-data`)."""

from kfp import dsl

from components.images import TRAINER_IMAGE


@dsl.component(base_image=TRAINER_IMAGE, install_kfp_package=False)
def prepare_data(
    target: str,
    recipe: str,
    dataset: dsl.Input[dsl.Dataset],
    prepared: dsl.Output[dsl.Dataset],
    metrics: dsl.Output[dsl.Metrics],
    overrides: list = [],
    mlflow_tracking_uri: str = "",
    mlflow_experiment: str = "flashdraft",
    parent_run_id: str = "",
):
    """Tokenise the warmup's `dataset` with `target`'s chat template; `prepared` is the cache folder the train
    step reads as data.cache_dir (so GPU nodes never tokenise), with stats.json.

    Args:
        target: the materialised target folder (from `target_warmup`).
        recipe, overrides: the pipeline's recipe and `key=value` overrides (the same as the train step's, so
            that the trainer finds this cache entry).
    """
    import os

    from flashdraft.tracking.runs import use_step_environment

    use_step_environment(mlflow_tracking_uri, mlflow_experiment, parent_run_id)
    from flashdraft.config import load_config, with_values
    from flashdraft.stages import prepare_data as stage

    values = {"target.name_or_path": target, "data.train": os.path.join(dataset.path, "train.jsonl"),
              "data.cache_dir": prepared.path}
    result = stage.run(with_values(load_config(recipe or None, overrides), values))
    for key in ("rows", "tokens", "supervised_tokens"):
        metrics.log_metric(key, result.stats[key])
