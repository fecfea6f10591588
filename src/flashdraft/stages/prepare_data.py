"""`flashdraft prepare-data --config RECIPE --output DIR [key=value ...]`: the training data, prepared on a
CPU before training: `data.train` / `data.eval` resolved (files, hub, packaged, mixtures), normalised,
rendered with the target's chat template, tokenised, short samples dropped; written as the Arrow dataset
the trainer reads (`data.cache_dir=DIR` makes it read this one) with `DIR/stats.json`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from flashdraft import files
from flashdraft.config import Config, to_yaml
from flashdraft.data.prepare import prepare_datasets
from flashdraft.objectives import get_objective
from flashdraft.stages.args import Flag, add_config_arguments, config_from_args, require
from flashdraft.target.source import load_target_config, load_tokenizer, source_of
from flashdraft.tracking.runs import check_tracking, step_run

FLAGS = [
    Flag("--output", "data.cache_dir", "folder of prepared datasets (reused when the inputs are the same)"),
    Flag("--target", "target.name_or_path", "the target whose tokenizer and chat template are used"),
    Flag("--train", "data.train", "training dataset spec(s)", {"nargs": "+"}),
    Flag("--num-proc", "data.num_proc", "processes that normalise and tokenise", {"type": int}),
]


@dataclass(frozen=True)
class PrepareResult:
    folder: Path  # the cache entry the trainer reads
    stats: dict


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, FLAGS)


def run(config: Config) -> PrepareResult:
    output = files.check_output_dir(require(config.data.cache_dir, "data.cache_dir", "--output"), "prepare-data",
                                   overwrite=None)
    check_tracking(config.tracking.uri)
    t = config.target
    source = source_of(t)
    target_config = load_target_config(source, trust_remote_code=t.trust_remote_code)
    tokenizer = load_tokenizer(source, trust_remote_code=t.trust_remote_code)
    # The objective decides which samples are too short to train on.
    objective = get_objective(config.objective.name).plan(config, target_config, tokenizer)
    with step_run("prepare-data", tracking_uri=config.tracking.uri, experiment=config.tracking.experiment) as run, \
            files.undone_on_bad_input(output):
        run.log_config(config)
        files.mark_output(output, "prepare-data")  # first: an interrupted run's rerun knows the folder
        prepared = prepare_datasets(config.data, tokenizer, min_supervised=objective.min_supervised_tokens,
                                    cache_dir=output)
        files.write_json(output / "stats.json", prepared.stats)
        files.write_text(output / "config.yaml", to_yaml(config))
        stats = prepared.stats
        run.log_metrics({"data.rows": stats["rows"], "data.tokens": stats["tokens"],
                         "data.supervised_tokens": stats["supervised_tokens"],
                         **{f"data.dropped.{k}": v for k, v in stats["dropped"].items()}})
        run.log_artifact(output / "stats.json")
    return PrepareResult(prepared.folder, stats)


def main(args: argparse.Namespace) -> int:
    result = run(config_from_args(args))
    stats = result.stats
    dropped = ", ".join(f"{k} {v}" for k, v in stats["dropped"].items()) or "none"
    print(f"prepare-data: {stats['rows']} rows, {stats['tokens']} tokens ({stats['supervised_tokens']} supervised), "
          f"dropped: {dropped} -> {result.folder}")
    return 0
