"""The trainer: wires config, data, objective, weights (target and draft, or the LM), FSDP2, optimizer,
checkpoints and metrics; runs the loop. It knows nothing of MLflow: logged metrics go to metrics.jsonl and
to the caller's `on_metrics` callback; the run returns its summary (also written to summary.json).

Order of work: cheap checks first (config, target config + tokenizer, the objective's plan, data
tokenisation), then weights. Each optimizer step reads `grad_accum_steps` micro-batches per rank; the
loss of every micro-step is divided by the objective's normaliser (`num_targets`: supervised tokens, or
their weight sum) over the WHOLE step (all ranks, all micro-steps), so gradients do not depend on how the
global batch is split.

Fault injection for tests: `FLASHDRAFT_CRASH_AFTER_STEP=k` kills the process (os._exit) right after
step k and its checkpoint, like a lost node.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import time
from collections import deque
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.tensor import DTensor
from tqdm import tqdm

from flashdraft.config import Config, flatten, redacted, to_dict, to_yaml
from flashdraft.errors import UserError
from flashdraft.data.loader import StepLoader, eval_batches
from flashdraft.data.prepare import prepare_datasets
from flashdraft.files import check_output_dir, holds_only, write_json, write_text
from flashdraft.objectives import add_sums, eval_sums, get_objective
from flashdraft.target.fast_path import fast_path_status, require_fast_path
from flashdraft.target.source import check_weights, load_target_config, load_tokenizer, source_of
from flashdraft.train.checkpoint import Checkpointer
from flashdraft.train.distributed import setup, shard, shard_frozen
from flashdraft.train.metrics import MetricsCallback, MetricsLog, peak_memory_gb
from flashdraft.train.models import export_trained, load_models
from flashdraft.train.optim import build_optimizer, build_schedule, lr_warmup_steps
from flashdraft.train.step import accumulate_gradients, global_sums

log = logging.getLogger(__name__)

CRASH_ENV = "FLASHDRAFT_CRASH_AFTER_STEP"
# What a run writes into train.output_dir (and a resumed run finds there).
TRAIN_OUTPUTS = ("config.yaml", "metrics.jsonl", "summary.json", "checkpoints", "export", "tokenized")
SUMMARY_WINDOW = 20  # the summary's train metrics cover the last steps


class Trainer:
    def __init__(self, config: Config, *, overwrite: bool = False):
        self.config = config
        # An earlier run's folder is resumed; a folder of the user's is never written into unasked.
        self.out = check_output_dir(config.train.output_dir, "train", flag="train.output_dir", overwrite=overwrite,
                                    produced=holds_only(*TRAIN_OUTPUTS))
        self.dist = dist = setup()
        train, t = config.train, config.target

        source = source_of(t)
        check_weights(source)  # before the data work, as everything below
        self.target_config = load_target_config(source, trust_remote_code=t.trust_remote_code)
        if t.require_fast_path:  # before the data and the weights: no silent 10x slower run
            require_fast_path(self.target_config)
        self.fast_path = fast_path_status(self.target_config)
        tokenizer = load_tokenizer(source, trust_remote_code=t.trust_remote_code)
        self.objective = get_objective(config.objective.name).plan(config, self.target_config, tokenizer)
        self.objective.use_device(dist.device)
        data = prepare_datasets(
            config.data,
            tokenizer,
            min_supervised=self.objective.min_supervised_tokens,
            cache_dir=Path(config.data.cache_dir) if config.data.cache_dir else self.out / "tokenized",
            is_main=dist.is_main,
            barrier=dist.barrier,
        )
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        pad_multiple = self.objective.pad_multiple
        if pad_multiple != config.data.pad_to_multiple:
            log.info("batches padded to multiples of %d tokens (data.pad_to_multiple=%d): one compiled "
                     "draft graph per padded length", pad_multiple, config.data.pad_to_multiple)
        self.loader = StepLoader(
            data.train,
            micro_batch=train.micro_batch_size,
            accum=train.grad_accum_steps,
            rank=dist.rank,
            world=dist.world,
            seed=config.data.seed,
            pad_id=pad_id,
            pad_to_multiple=pad_multiple,
        )
        self.eval_set = []
        if data.eval is not None:
            self.eval_set = eval_batches(data.eval, micro_batch=train.micro_batch_size, rank=dist.rank,
                                         world=dist.world, pad_id=pad_id, pad_to_multiple=pad_multiple)
            if not self.eval_set:
                log.warning("the eval set has no samples left after filtering; no evaluation")
        self.total_steps = self.loader.steps_per_epoch * train.epochs
        if train.max_steps is not None:
            self.total_steps = min(self.total_steps, train.max_steps)

        models = load_models(config, self.objective, dist.device)
        if train.shard_target:
            shard_frozen(models.frozen_shard_units)
        self.model = shard(models.model, models.shard_units, dist.device)
        self.optimizer = build_optimizer(self.model, train)
        self.schedule = build_schedule(self.optimizer, lr_warmup_steps(train, self.total_steps), self.total_steps)
        self.checkpointer = Checkpointer(self.out / "checkpoints", dist, train.keep_checkpoints)

    # -- one step --------------------------------------------------------------------------------
    def train_step(self, step: int) -> tuple[dict[str, torch.Tensor], float, float]:
        """One optimizer step; the global sums, the gradient norm before clipping, the global useful FLOPs."""
        sums = self.accumulate_gradients(step)
        clip = self.config.train.grad_clip or math.inf
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        norm = norm.full_tensor() if isinstance(norm, DTensor) else norm
        self.optimizer.step()
        self.schedule.step()
        self.optimizer.zero_grad(set_to_none=True)
        return sums, float(norm), float(sums.pop("flops"))

    def accumulate_gradients(self, step: int) -> dict[str, torch.Tensor]:
        """Forward/backward over this rank's micro-batches of `step`; the metric sums over all ranks."""
        prepared = [self.objective.prepare(b, step) for b in self.loader.micro_batches(step)]
        return accumulate_gradients(self.objective, self.model, prepared, self.dist)

    def evaluate(self) -> dict[str, float]:
        """The objective's metrics on the held-out set (all ranks), prefixed eval_."""
        sums = global_sums(eval_sums(self.objective, self.model, self.eval_set), self.dist)
        return {f"eval_{k}": v for k, v in self.objective.summarise(sums).items()}

    # -- the run ---------------------------------------------------------------------------------
    def run(self, on_metrics: MetricsCallback | None = None) -> dict[str, Any]:
        """Train (resuming from the newest checkpoint), evaluate, export; the summary (every rank), also
        written to summary.json. `on_metrics(step, values)` gets every logged line of metrics.jsonl (rank 0)."""
        dist, train = self.dist, self.config.train
        resolved = redacted(to_dict(self.config))  # what checkpoints and summary.json record
        if dist.is_main:
            write_text(self.out / "config.yaml", to_yaml(self.config))
            for leftover in self.out.glob(".export.*.tmp"):  # of an export that died with its process
                shutil.rmtree(leftover, ignore_errors=True)
        metrics = MetricsLog(self.out / "metrics.jsonl", dist.is_main, on_metrics)
        start, totals = self.resume(resolved)
        # Resumed: drop what a dead run logged after its last checkpoint. Fresh: a new log, not one
        # appended to an earlier run's in the same folder.
        metrics.truncate_after(start, finished=start == self.total_steps)
        crash_after = int(os.environ.get(CRASH_ENV, 0)) or None

        # The summary covers the whole run, also when resumed: the window and the totals travel in checkpoints.
        recent: deque = deque(([_tensors(s) for s in totals["recent"]]), maxlen=SUMMARY_WINDOW)
        run_time, run_tokens = totals["seconds"], totals["tokens"]
        interval: dict[str, torch.Tensor] = {}
        interval_time = interval_flops = 0.0
        interval_steps = 0
        bar = tqdm(total=self.total_steps, initial=start, desc="train", disable=not dist.is_main)
        for step in range(start, self.total_steps):
            lr = self.schedule.get_last_lr()[0]
            began = time.perf_counter()
            sums, grad_norm, flops = self.train_step(step)
            elapsed = time.perf_counter() - began
            done = step + 1
            recent.append(sums)
            add_sums(interval, sums)
            interval_time += elapsed
            interval_steps += 1
            interval_flops += flops
            run_time += elapsed
            run_tokens += float(sums["tokens"])
            if done % train.log_every == 0 or done == self.total_steps:
                values = self.objective.summarise(interval)
                values.update(
                    lr=lr,
                    grad_norm=grad_norm,
                    epoch=step / self.loader.steps_per_epoch,
                    tokens_per_s=float(interval["tokens"]) / interval_time,
                    step_time_s=interval_time / interval_steps,
                    peak_memory_gb=peak_memory_gb(dist.device),
                )
                if dist.device.type == "cuda":
                    values["mfu"] = interval_flops / interval_time / (dist.world * train.peak_tflops * 1e12)
                metrics.log(done, values)
                bar.set_postfix({k: f"{values[k]:.3f}" for k in ("loss", "tau") if k in values})
                interval, interval_time, interval_flops, interval_steps = {}, 0.0, 0.0, 0
            if train.eval_every and done % train.eval_every == 0 and done < self.total_steps and self.eval_set:
                metrics.log(done, self.evaluate())
            if done % train.checkpoint_every == 0 or done == self.total_steps:
                self.checkpointer.save(done, self.model, self.optimizer, {
                    "schedule": self.schedule.state_dict(),
                    "data": self.loader.position(done),
                    "config": resolved,
                    "totals": {"seconds": run_time, "tokens": run_tokens, "recent": [_floats(s) for s in recent]},
                })
            bar.update(1)
            if crash_after == done:
                os._exit(17)
        bar.close()

        final_eval = self.evaluate() if self.eval_set else {}
        if final_eval:
            metrics.log(self.total_steps, final_eval)
        export = self.export()
        summary: dict[str, Any] = {"steps": self.total_steps, "resumed_from_step": start or None}
        if recent:
            window: dict[str, torch.Tensor] = {}
            for sums in recent:
                add_sums(window, sums)
            summary.update(self.objective.summarise(window))
            summary["summary_window_steps"] = len(recent)
        if run_time:
            summary["tokens_per_s"] = run_tokens / run_time
        summary.update(final_eval)
        summary.update(peak_memory_gb=peak_memory_gb(dist.device), target_fast_path=self.fast_path,
                       export=str(export), config=resolved)
        if dist.is_main:
            write_json(self.out / "summary.json", summary, indent=1)
        return summary

    def resume(self, resolved: dict) -> tuple[int, dict]:
        """Restore the newest checkpoint, if any; the step to start from and the run's totals so far."""
        state = self.checkpointer.load_latest(self.model, self.optimizer)
        if state is None:
            return 0, {"seconds": 0.0, "tokens": 0.0, "recent": []}
        changes = run_changes(state["config"], resolved)
        if changes and self.config.train.resume != "force":
            raise UserError(
                f"the checkpoints in {self.checkpointer.root} were written with other settings ({'; '.join(changes)}): "
                "resuming would mix two runs. Rerun with the recorded settings (config.yaml there), give a new "
                "train.output_dir, or set train.resume=force to resume anyway"
            )
        if changes:
            log.warning("train.resume=force: resuming with changed settings: %s", "; ".join(changes))
        self.schedule.load_state_dict(state["schedule"])
        if state["data"]["global_batch"] != self.loader.global_batch:
            log.warning("resuming with a global batch of %d instead of %d: the data order from step %d on "
                        "differs from the original run's", self.loader.global_batch, state["data"]["global_batch"],
                        state["step"])
        return state["step"], state["totals"]

    def export(self) -> Path:
        """The trained model as an HF folder, `<output_dir>/export` (gathered on rank 0)."""
        path = self.out / "export"
        full = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.dist.is_main:
            export_trained(self.config, self.objective, self.target_config, full, path)
        self.dist.barrier()
        return path


# Settings a resumed run may change: where things are written and logged, how often, how long it runs.
RESUMABLE_CHANGES = {
    "recipe", "train.output_dir", "train.eval_every", "train.checkpoint_every", "train.keep_checkpoints",
    "train.log_every", "train.peak_tflops", "train.resume", "data.cache_dir", "data.num_proc", "target.cache_dir",
}
# Sections that do not describe the training at all.
OTHER_STAGES = ("warmup", "evaluate", "promote", "launch", "tracking")
GROWABLE = ("train.max_steps", "train.epochs")


def run_changes(recorded: dict, current: dict) -> list[str]:
    """`key old -> new` for every setting that differs from the checkpoint's and would change the run."""
    old, new = flatten(recorded), flatten(current)
    changes = []
    for key in sorted(set(old) | set(new)):
        if key in RESUMABLE_CHANGES or key.split(".")[0] in OTHER_STAGES or old.get(key) == new.get(key):
            continue
        if key in GROWABLE and _grows(old.get(key), new.get(key)):
            continue
        changes.append(f"{key} {old.get(key)!r} -> {new.get(key)!r}")
    return changes


def _grows(old, new) -> bool:
    return new is None or (old is not None and new >= old)


def _floats(sums: dict[str, torch.Tensor]) -> dict[str, list | float]:
    return {k: v.tolist() for k, v in sums.items()}


def _tensors(sums: dict) -> dict[str, torch.Tensor]:
    return {k: torch.tensor(v, dtype=torch.float64) for k, v in sums.items()}
