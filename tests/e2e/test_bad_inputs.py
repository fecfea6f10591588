"""Bad inputs to every `flashdraft` command, as a new user would give them: each must end in exit code 2
and ONE line `flashdraft STAGE: error: ...` that names the problem, with no traceback, before any heavy
work, and with nothing written, removed or changed on disk (the case's folder, the user's "home" and the
shared inputs are compared before and after).

`CASES` is also what `benchmarks/bad_inputs_table.py` runs to write docs/bad-inputs.md. A case is an
argv with placeholders (below), the files it needs (`given`) and the text its error must hold. Cases run
in this process through `flashdraft.cli.main` (fast); those that need a process of their own (torchrun,
an environment read at import) run `python -m flashdraft.cli`.

The argv placeholders are listed in PLACEHOLDERS.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import io
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from tiny_models import save_tiny_draft, save_tiny_target
from train_helpers import alphabet_chats

REPO = Path(__file__).resolve().parents[2]
PLACEHOLDERS = {
    "tmp": "the case's own folder, also the working folder ($HOME is {tmp}/home)",
    "target": "a tiny random qwen3 target (HF folder)",
    "draft": "a DFlash draft for it (block size 16)",
    "chats": "a JSONL chat file (OpenAI messages)",
    "report": "a sound `flashdraft evaluate` report",
    "mlflow": "a sqlite tracking store and registry",
    "closed": "a TCP port on 127.0.0.1 that nothing listens on",
    "repo": "the repository root",
}

# -- the shared inputs -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Shared:
    """Inputs every case may read (never write): the values of the placeholders but {tmp}."""

    root: Path
    values: dict[str, str]


def good_report(tau: Any = 3.0, lossless: Any = 1.0, speedup: Any = 1.5, name: str = "gsm8k") -> dict:
    return {"benchmarks": {name: {"speculative": {"tau_pooled": tau}, "lossless": lossless, "speedup": speedup}}}


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def make_shared(root: Path, target: Path | None = None) -> Shared:
    """The shared inputs under `root`; `target`: an existing tiny target folder (else one is saved)."""
    from mlflow import MlflowClient

    root.mkdir(parents=True, exist_ok=True)
    target = target or save_tiny_target(root / "target")
    draft = save_tiny_draft(root / "draft")
    chats = alphabet_chats(root / "chats.jsonl", rows=8)
    report = root / "report.json"
    report.write_text(json.dumps(good_report()))
    values = {"target": target, "draft": draft, "chats": chats, "report": report,
              "mlflow": f"sqlite:///{root / 'mlflow' / 'mlflow.db'}", "closed": closed_port(), "repo": REPO}
    (root / "mlflow").mkdir(exist_ok=True)
    # Created here, so that promote cases log their artifacts (if any) beside the store, not in a case folder.
    artifacts = (root / "mlflow" / "artifacts").as_uri()
    MlflowClient(values["mlflow"]).create_experiment("flashdraft", artifact_location=artifacts)
    return Shared(root, {name: str(value) for name, value in values.items()})


def warm_imports() -> None:
    """Import every stage (and what reads the environment at import: datasets, huggingface_hub) before a
    case points $HOME at its own folder, so that no library settles its caches there."""
    from flashdraft import cli
    from flashdraft.stages import STAGES

    for name in STAGES:
        cli.stage_parser(name)
    for module in ("datasets", "huggingface_hub", "mlflow", "transformers"):
        importlib.import_module(module)


# -- what a case sets up ---------------------------------------------------------------------------


class Given:
    """One file or folder a case needs, made in the case's folder before the command runs."""

    def __call__(self, tmp: Path, shared: Shared) -> None:
        raise NotImplementedError


def _expand(text: str, tmp: Path, shared: Shared) -> str:
    values = {"tmp": str(tmp), **shared.values}
    return re.sub(r"\{(\w+)\}", lambda m: values.get(m[1], m[0]), text)


@dataclass(frozen=True)
class Text(Given):
    path: str
    text: str
    what: str = ""

    def __call__(self, tmp, shared):
        target = tmp / self.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(_expand(self.text, tmp, shared))

    def __str__(self):
        return f"{self.path}: {self.what or repr(self.text[:60])}"


@dataclass(frozen=True)
class Json(Given):
    path: str
    data: Any
    what: str = ""

    def __call__(self, tmp, shared):
        (tmp / self.path).parent.mkdir(parents=True, exist_ok=True)
        (tmp / self.path).write_text(json.dumps(self.data))  # NaN and Infinity as Python writes them

    def __str__(self):
        return f"{self.path}: {self.what or json.dumps(self.data)[:80]}"


@dataclass(frozen=True)
class Folder(Given):
    path: str

    def __call__(self, tmp, shared):
        (tmp / self.path).mkdir(parents=True, exist_ok=True)

    def __str__(self):
        return f"{self.path}/: an empty folder"


@dataclass(frozen=True)
class Copy(Given):
    """A copy of a shared input ({draft}, {target}, ...) as `path`, then `edits` applied to its files."""

    source: str
    path: str
    edits: tuple[Callable[[Path], None], ...] = ()
    what: str = ""

    def __call__(self, tmp, shared):
        source = Path(_expand(self.source, tmp, shared))
        dest = tmp / self.path
        if source.is_dir():
            shutil.copytree(source, dest)
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, dest)
        for edit in self.edits:
            edit(dest)

    def __str__(self):
        return f"{self.path}: {self.source} {self.what}".rstrip()


@dataclass(frozen=True)
class Parquet(Given):
    path: str
    rows: list[dict]
    truncate_to: int | None = None  # keep only the first bytes: a torn file

    def __call__(self, tmp, shared):
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = tmp / self.path
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(self.rows), path)
        if self.truncate_to is not None:
            data = path.read_bytes()
            path.write_bytes(data[: self.truncate_to])

    def __str__(self):
        torn = f", cut to {self.truncate_to} bytes" if self.truncate_to is not None else ""
        return f"{self.path}: parquet with columns {sorted(self.rows[0])}{torn}"


def truncate(name: str, keep: int) -> Callable[[Path], None]:
    """Edit: cut file `name` of a copied folder to its first `keep` bytes (negative: drop the last -keep)."""

    def edit(folder: Path) -> None:
        path = folder / name
        data = path.read_bytes()
        path.write_bytes(data[:keep])

    return edit


def replace_file(name: str, content: str) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        (folder / name).write_text(content)

    return edit


def set_json(name: str, **values: Any) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        data = json.loads((folder / name).read_text())
        data.update(values)
        (folder / name).write_text(json.dumps(data))

    return edit


def remove(name: str) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        (folder / name).unlink()

    return edit


PIPELINE_OK = '''
from kfp import dsl

PROFILES = {"local": {"steps": 1}}


@dsl.component(base_image="python:3.11")
def echo(text: str) -> str:
    return text


@dsl.pipeline(name="tiny")
def tiny(steps: int = 1, rate: float = 0.5, names: list = [], text: str = "x") -> str:
    return echo(text=text).output
'''


# -- the cases -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]  # `flashdraft` arguments, the command first, with placeholders
    expect: str  # text the error line must hold (case-insensitive)
    given: tuple[Given, ...] = ()
    subprocess: bool = False  # run `python -m flashdraft.cli` (torchrun, or an environment read at import)
    env: dict[str, str] = field(default_factory=dict)
    timeout: float = 30.0  # seconds; a bad input must fail fast

    @property
    def command(self) -> str:
        return self.argv[0]

    def shown(self) -> str:
        """The input as the table shows it: the command line and the files it was given."""
        line = "flashdraft " + " ".join(a if a and " " not in a else repr(a) for a in self.argv)
        env = " ".join(f"{k}={v}" for k, v in self.env.items())
        given = "; ".join(map(str, self.given))
        return (f"{env} " if env else "") + line + (f" (given {given})" if given else "")


def C(id: str, argv: str | Sequence[str], expect: str, *given: Given, **options: Any) -> Case:
    """A case; a string argv is split on spaces (use a sequence for arguments with spaces)."""
    return Case(id, tuple(argv.split() if isinstance(argv, str) else argv), expect, tuple(given), **options)


USER_FILES = (Text("mine/notes.txt", "my notes", "a user's file"),)
TARGET = "--target {target}"
DRAFT_INIT = "draft-init --target {target} --output {tmp}/out"
WARMUP = "warmup --target {target} --prompts {chats} --output {tmp}/out"
PREPARE = "prepare-data --target {target} --train {chats} --output {tmp}/out"
TRAIN = "train target.name_or_path={target} data.train={chats} train.output_dir={tmp}/out train.max_steps=1"
EVALUATE = "evaluate --target {target} --draft {draft} --output {tmp}/report.json --num-prompts 1"
HELD_OUT = "data.train={chats} data.eval_samples=2 objective.allow_causal_model=true objective.mask_token_id=3"
DLLM = f"dllm-evaluate --model {{target}} --output {{tmp}}/report.json {HELD_OUT}"
PROMOTE_TO = "promote --draft {draft} --tracking-uri {mlflow}"  # + --report and --model-name
PROMOTE_REPORT = f"{PROMOTE_TO} --model-name bad-input --report"  # + the report
PROMOTE = f"{PROMOTE_REPORT} {{report}}"
LAUNCH = "launch --dry-run --backend pytorchjob --image reg/flashdraft-trainer:1 --namespace ns"
RUN = "run {tmp}/tiny.py --local"
SUBMIT = "submit {tmp}/tiny.py --host http://127.0.0.1:{closed} --experiment e"
TINY_PIPELINE = Text("tiny.py", PIPELINE_OK, "a one-step pipeline")

BAD_ROLE = '{"messages": [{"role": "robot", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n'
SHAREGPT = '{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}\n'

DRAFT_INIT_CASES = [
    C("draft-init-unknown-key", f"{DRAFT_INIT} draft.nmu_layers=2", "unknown config key(s) draft.nmu_layers"),
    C("draft-init-unknown-section", f"{DRAFT_INIT} drafts.num_layers=2", "unknown config key(s) drafts"),
    C("draft-init-renamed-section", f"{DRAFT_INIT} strategy.name=dflash", "renamed to 'objective'"),
    C("draft-init-flag-not-int", f"{DRAFT_INIT} --num-layers two", "invalid int value"),
    C("draft-init-key-not-int", f"{DRAFT_INIT} draft.num_layers=two", "draft.num_layers: expected int"),
    C("draft-init-key-bool-for-int", f"{DRAFT_INIT} draft.num_layers=true", "draft.num_layers: expected int"),
    C("draft-init-block-size-1", f"{DRAFT_INIT} --block-size 1", "draft.block_size must be >= 2"),
    C("draft-init-zero-layers", f"{DRAFT_INIT} --num-layers 0", "draft.num_layers must be >= 1"),
    C("draft-init-zero-taps", f"{DRAFT_INIT} --num-taps 0", "draft.num_taps must be >= 1"),
    C("draft-init-taps-not-ints", f"{DRAFT_INIT} --target-layer-ids 1,x", "comma-separated integers"),
    C("draft-init-taps-out-of-range", f"{DRAFT_INIT} --target-layer-ids 1,99", "out of range"),
    C("draft-init-taps-empty-list", f"{DRAFT_INIT} draft.target_layer_ids=[]", "non-empty list"),
    C("draft-init-mask-token-out-of-vocab", f"{DRAFT_INIT} --mask-token-id 100000", "mask"),
    C("draft-init-hidden-size-mismatch", f"{DRAFT_INIT} draft.hidden_size=65", "hidden size 65"),
    C("draft-init-target-dtype-float77", f"{DRAFT_INIT} target.dtype=float77", "target.dtype must be one of"),
    C("draft-init-no-output", f"draft-init {TARGET}", "draft.output_dir is not set"),
    C("draft-init-output-is-file", f"draft-init {TARGET} --output {{tmp}}/out.txt", "is a file",
      Text("out.txt", "keep me")),
    C("draft-init-output-user-folder", f"draft-init {TARGET} --output {{tmp}}/mine", "not empty", *USER_FILES),
    C("draft-init-output-dot", f"draft-init {TARGET} --output .", "working, home or root folder", *USER_FILES),
    C("draft-init-output-home", f"draft-init {TARGET} --output ~", "working, home or root folder",
      Text("home/notes.txt", "my notes", "a file in $HOME")),
    C("draft-init-output-root", f"draft-init {TARGET} --output /", "working, home or root folder"),
    C("draft-init-target-missing", "draft-init --target {tmp}/nope --output {tmp}/out", "does not exist"),
    C("draft-init-target-is-jsonl", "draft-init --target {chats} --output {tmp}/out", "not a .gguf"),
    C("draft-init-target-empty-folder", "draft-init --target {tmp}/t --output {tmp}/out", "target",
      Folder("t")),
    C("draft-init-target-corrupt-config", "draft-init --target {tmp}/t --output {tmp}/out", "cannot read target",
      Copy("{target}", "t", (replace_file("config.json", '{"model_type": "qwen3", '),), "with config.json cut short")),
    C("draft-init-target-not-causal-lm", "draft-init --target {tmp}/t --output {tmp}/out",
      "not a causal language model",
      Copy("{target}", "t", (set_json("config.json", model_type="vit", architectures=["ViTModel"]),),
           "with a ViT (image) config.json")),
    C("draft-init-fake-gguf", "draft-init --target {tmp}/model.gguf --output {tmp}/out", "gguf",
      Text("model.gguf", "not a gguf", "a text file named .gguf")),
    C("draft-init-packaged-unknown", "draft-init --target packaged:gpt5 --output {tmp}/out",
      "unknown packaged target"),
    C("draft-init-hub-id-offline", "draft-init --target nonexistent-org/no-model --output {tmp}/out",
      "cannot fetch target", subprocess=True, env={"HF_HUB_OFFLINE": "1"}),
    C("draft-init-recipe-unknown", f"{DRAFT_INIT} --config nosuch", "unknown recipe 'nosuch'"),
    C("draft-init-recipe-file-missing", f"{DRAFT_INIT} --config {{tmp}}/nope.yaml", "does not exist"),
    C("draft-init-recipe-invalid-yaml", f"{DRAFT_INIT} --config {{tmp}}/r.yaml", "is not valid YAML",
      Text("r.yaml", "draft: {num_layers: 2\n", "an unclosed mapping")),
    C("draft-init-recipe-a-list", f"{DRAFT_INIT} --config {{tmp}}/r.yaml", "must hold a mapping",
      Text("r.yaml", "- draft\n- target\n", "a YAML list")),
    C("draft-init-recipe-section-a-string", f"{DRAFT_INIT} --config {{tmp}}/r.yaml", "draft",
      Text("r.yaml", "draft: small\n", "draft: small")),
    C("draft-init-recipe-is-folder", f"{DRAFT_INIT} --config {{tmp}}/r.yaml", "r.yaml", Folder("r.yaml")),
    C("draft-init-override-no-equals", f"{DRAFT_INIT} draft.num_layers", "not of the form key=value"),
    C("draft-init-override-below-leaf", f"{DRAFT_INIT} draft.num_layers.x=1", "draft.num_layers: expected int"),
    C("draft-init-override-bad-yaml", f"{DRAFT_INIT} draft.target_layer_ids=[1,", "is not valid YAML"),
    C("draft-init-tracking-uri-closed-port", f"{DRAFT_INIT} tracking.uri=http://127.0.0.1:{{closed}}",
      "cannot reach the MLflow server"),
    C("draft-init-tracking-uri-bad-scheme", f"{DRAFT_INIT} tracking.uri=nosuch://x", "is not a tracking URI"),
]

WARMUP_CASES = [
    C("warmup-no-output", f"warmup {TARGET} --prompts {{chats}}", "warmup.output_dir is not set"),
    C("warmup-output-is-file", f"warmup {TARGET} --prompts {{chats}} --output {{tmp}}/out.txt", "is a file",
      Text("out.txt", "keep me")),
    C("warmup-output-user-folder", f"warmup {TARGET} --prompts {{chats}} --output {{tmp}}/mine", "not empty",
      *USER_FILES),
    C("warmup-output-dot", f"warmup {TARGET} --prompts {{chats}} --output .", "working, home or root folder",
      *USER_FILES),
    C("warmup-prompts-missing-file", f"warmup {TARGET} --prompts {{tmp}}/nope.jsonl --output {{tmp}}/out",
      "does not exist"),
    C("warmup-prompts-txt-file", f"warmup {TARGET} --prompts {{tmp}}/p.txt --output {{tmp}}/out", "must end in",
      Text("p.txt", "hello\n")),
    C("warmup-prompts-unknown-packaged", f"warmup {TARGET} --prompts packaged:nosuch --output {{tmp}}/out",
      "unknown packaged dataset"),
    C("warmup-prompts-bad-weight", f"warmup {TARGET} --prompts {{chats}}@lots --output {{tmp}}/out",
      "is not a number"),
    C("warmup-prompts-zero-weight", f"warmup {TARGET} --prompts {{chats}}@0 --output {{tmp}}/out",
      "weight must be a positive number"),
    C("warmup-prompts-not-a-spec", f"warmup {TARGET} --prompts no_such_thing --output {{tmp}}/out",
      "neither an existing file"),
    C("warmup-prompts-empty-file", f"warmup {TARGET} --prompts {{tmp}}/p.jsonl --output {{tmp}}/out", "is empty",
      Text("p.jsonl", "")),
    C("warmup-prompts-empty-list", f"{WARMUP} warmup.prompts=[]", "at least one dataset spec"),
    C("warmup-backend-flag-transformers", f"{WARMUP} --backend transformers", "invalid choice"),
    C("warmup-backend-key-transformers", f"{WARMUP} warmup.backend=transformers", "was split in two"),
    C("warmup-backend-key-unknown", f"{WARMUP} warmup.backend=sglang", "warmup.backend must be one of"),
    C("warmup-turns-flag", f"{WARMUP} --turns some", "invalid choice"),
    C("warmup-turns-key", f"{WARMUP} warmup.turns=second", "warmup.turns must be one of"),
    C("warmup-top-p-above-1", f"{WARMUP} --top-p 1.5", "warmup.top_p must be in (0, 1]"),
    C("warmup-negative-temperature", f"{WARMUP} --temperature -1", "warmup.temperature must be >= 0"),
    C("warmup-zero-new-tokens", f"{WARMUP} --max-new-tokens 0", "warmup.max_new_tokens must be >= 1"),
    C("warmup-zero-rows", f"{WARMUP} --rows 0", "warmup.rows must be >= 1"),
    C("warmup-rows-static-backend", f"{WARMUP} --backend static --rows 2", "warmup.rows is the graphed backend's"),
    C("warmup-thinking-maybe", f"{WARMUP} --thinking maybe", "expected on or off"),
    C("warmup-format-csv", f"{WARMUP} --format csv", "invalid choice"),
    C("warmup-chat-template-missing", f"{WARMUP} --chat-template {{tmp}}/nope.jinja", "nope.jinja"),
    C("warmup-thinking-without-switch", f"{WARMUP} --thinking on", "enable_thinking"),
    C("warmup-target-missing", "warmup --target {tmp}/nope --prompts {chats} --output {tmp}/out",
      "does not exist"),
    C("warmup-target-truncated-weights", "warmup --target {tmp}/t --prompts {chats} --output {tmp}/out",
      "model.safetensors",
      Copy("{target}", "t", (truncate("model.safetensors", 1000),), "with model.safetensors cut to 1000 bytes")),
    C("warmup-tracking-uri-bad-scheme", f"{WARMUP} tracking.uri=mlflow:/nowhere", "is not a tracking URI"),
    C("warmup-target-dtype-float77", f"{WARMUP} target.dtype=float77", "target.dtype must be one of"),
]

PREPARE_CASES = [
    C("prepare-no-output", f"prepare-data {TARGET} --train {{chats}}", "data.cache_dir is not set"),
    C("prepare-output-is-file", f"prepare-data {TARGET} --train {{chats}} --output {{tmp}}/out.txt", "is a file",
      Text("out.txt", "keep me")),
    C("prepare-output-user-folder", f"prepare-data {TARGET} --train {{chats}} --output {{tmp}}/mine", "not empty",
      *USER_FILES),
    C("prepare-output-home", f"prepare-data {TARGET} --train {{chats}} --output ~", "working, home or root folder",
      Text("home/notes.txt", "my notes", "a file in $HOME")),
    C("prepare-train-missing", f"prepare-data {TARGET} --train {{tmp}}/nope.jsonl --output {{tmp}}/out",
      "does not exist"),
    C("prepare-train-is-folder", f"prepare-data {TARGET} --train {{tmp}}/d.jsonl --output {{tmp}}/out",
      "d.jsonl", Folder("d.jsonl")),
    C("prepare-jsonl-bad-line", f"prepare-data {TARGET} --train {{tmp}}/c.jsonl --output {{tmp}}/out",
      "line 2 is not valid JSON", Text("c.jsonl", SHAREGPT + "{not json\n", "line 2 is not JSON")),
    C("prepare-jsonl-not-objects", f"prepare-data {TARGET} --train {{tmp}}/c.jsonl --output {{tmp}}/out",
      "expected a JSON object", Text("c.jsonl", "[1, 2]\n[3]\n", "lines that are lists")),
    C("prepare-json-torn", f"prepare-data {TARGET} --train {{tmp}}/c.json --output {{tmp}}/out",
      "is not valid JSON", Text("c.json", '[{"messages": [{"role": "user", "content": "hi"}', "a JSON list cut short")),
    C("prepare-parquet-torn", f"prepare-data {TARGET} --train {{tmp}}/c.parquet --output {{tmp}}/out",
      "cannot read", Parquet("c.parquet", [{"prompt": "hi", "response": "yo"}] * 4, truncate_to=100)),
    C("prepare-parquet-no-chat-columns", f"prepare-data {TARGET} --train {{tmp}}/c.parquet --output {{tmp}}/out",
      "no conversation format fits", Parquet("c.parquet", [{"a": 1, "b": "x"}] * 4)),
    C("prepare-bad-role", f"prepare-data {TARGET} --train {{tmp}}/c.jsonl --output {{tmp}}/out",
      "data.skip_bad_rows=true", Text("c.jsonl", BAD_ROLE * 3, "rows with role 'robot'")),
    C("prepare-only-bad-rows-skipped", f"prepare-data {TARGET} --train {{tmp}}/c.jsonl --output {{tmp}}/out "
      "data.skip_bad_rows=true", "no usable rows", Text("c.jsonl", BAD_ROLE * 3, "rows with role 'robot'")),
    C("prepare-format-forced-wrong", f"{PREPARE} data.format=sharegpt", "bad row"),
    C("prepare-format-unknown", f"{PREPARE} data.format=csv", "data.format must be one of"),
    C("prepare-skip-bad-rows-maybe", f"{PREPARE} data.skip_bad_rows=maybe", "data.skip_bad_rows: expected bool"),
    C("prepare-num-proc-0", f"{PREPARE} --num-proc 0", "data.num_proc must be >= 1"),
    C("prepare-max-length-1", f"{PREPARE} data.max_length=1", "data.max_length must be >= 2"),
    C("prepare-half-weighted-mixture", f"prepare-data {TARGET} --train {{chats}}@1 packaged:chitchat "
      "--output {tmp}/out", "give a weight"),
    C("prepare-eval-samples-negative", f"{PREPARE} data.eval_samples=-1", "data.eval_samples must be >= 0"),
    C("prepare-limit-0", f"{PREPARE} data.limit=0", "data.limit must be >= 1"),
    C("prepare-empty-jsonl", f"prepare-data {TARGET} --train {{tmp}}/c.jsonl --output {{tmp}}/out", "is empty",
      Text("c.jsonl", "\n\n", "blank lines only")),
    C("prepare-tracking-uri-closed-port", f"{PREPARE} tracking.uri=http://127.0.0.1:{{closed}}",
      "cannot reach the MLflow server"),
    C("prepare-objective-unknown", f"{PREPARE} objective.name=ppo", "unknown objective 'ppo'"),
]

TRAIN_CASES = [
    C("train-renamed-warmup-steps", f"{TRAIN} train.warmup_steps=10", "renamed to train.lr_warmup_steps"),
    C("train-renamed-warmup-ratio", f"{TRAIN} train.warmup_ratio=0.1", "renamed to train.lr_warmup_ratio"),
    C("train-renamed-strategy", f"{TRAIN} strategy.num_anchors=4", "renamed to 'objective'"),
    C("train-unknown-key", f"{TRAIN} train.learning_rate=0.1", "unknown config key(s) train.learning_rate"),
    C("train-lr-zero", f"{TRAIN} train.lr=0", "train.lr must be a finite number > 0"),
    C("train-lr-nan", f"{TRAIN} train.lr=.nan", "train.lr"),
    C("train-lr-text", f"{TRAIN} train.lr=fast", "train.lr: expected float"),
    C("train-betas-one", f"{TRAIN} train.betas=[0.9]", "train.betas must be two numbers"),
    C("train-micro-batch-0", f"{TRAIN} train.micro_batch_size=0", "train.micro_batch_size must be >= 1"),
    C("train-max-steps-0", f"{TRAIN} train.max_steps=0", "train.max_steps must be >= 1"),
    C("train-warmup-ratio-1", f"{TRAIN} train.lr_warmup_ratio=1.0", "train.lr_warmup_ratio must be in [0, 1)"),
    C("train-resume-maybe", f"{TRAIN} train.resume=maybe", "train.resume must be one of"),
    C("train-objective-unknown", f"{TRAIN} objective.name=ppo", "unknown objective 'ppo'"),
    C("train-attention-cuda", f"{TRAIN} objective.attention=cuda", "objective.attention must be one of"),
    C("train-mdlm-eps-1", f"{TRAIN} objective.mdlm_eps=1", "objective.mdlm_eps must be in (0, 1)"),
    C("train-output-is-file", "train target.name_or_path={target} data.train={chats} "
      "train.output_dir={tmp}/out.txt", "is a file", Text("out.txt", "keep me")),
    C("train-output-user-folder", "train target.name_or_path={target} data.train={chats} "
      "train.output_dir={tmp}/mine", "not empty", *USER_FILES),
    C("train-output-dot", "train target.name_or_path={target} data.train={chats} train.output_dir=.",
      "working, home or root folder", *USER_FILES),
    C("train-data-missing", "train target.name_or_path={target} data.train={tmp}/nope.jsonl "
      "train.output_dir={tmp}/out", "does not exist"),
    C("train-target-missing", "train target.name_or_path={tmp}/nope data.train={chats} "
      "train.output_dir={tmp}/out", "does not exist"),
    C("train-target-dtype-float77", f"{TRAIN} target.dtype=float77", "target.dtype must be one of"),
    C("train-target-truncated-weights", "train target.name_or_path={tmp}/t data.train={chats} "
      "train.output_dir={tmp}/out train.max_steps=1", "model.safetensors",
      Copy("{target}", "t", (truncate("model.safetensors", 1000),), "with model.safetensors cut to 1000 bytes")),
    C("train-init-from-missing", f"{TRAIN} draft.init_from={{tmp}}/nope", "draft.init_from"),
    C("train-init-from-truncated", f"{TRAIN} draft.init_from={{tmp}}/d", "model.safetensors",
      Copy("{draft}", "d", (truncate("model.safetensors", 5000),), "with model.safetensors cut to 5000 bytes")),
    C("train-init-from-not-safetensors", f"{TRAIN} draft.init_from={{tmp}}/d", "not a safetensors file",
      Copy("{draft}", "d", (replace_file("model.safetensors", "this is text"),), "with a text model.safetensors")),
    C("train-init-from-overrides-shape", f"{TRAIN} draft.init_from={{draft}} draft.block_size=4", "block_size"),
    C("train-data-bad-role", "train target.name_or_path={target} data.train={tmp}/c.jsonl "
      "train.output_dir={tmp}/out", "data.skip_bad_rows=true", Text("c.jsonl", BAD_ROLE * 3, "rows with role 'robot'")),
    C("train-tracking-uri-closed-port", f"{TRAIN} tracking.uri=http://127.0.0.1:{{closed}}",
      "cannot reach the MLflow server"),
    C("train-overwrite-not-a-value", f"{TRAIN} --overwrite=yes", "ignored explicit argument"),
]

EVALUATE_CASES = [
    C("evaluate-no-draft", f"evaluate {TARGET} --output {{tmp}}/report.json", "evaluate.draft is not set"),
    C("evaluate-no-output", f"evaluate {TARGET} --draft {{draft}}", "evaluate.output is not set"),
    C("evaluate-draft-missing", f"evaluate {TARGET} --draft {{tmp}}/nope --output {{tmp}}/report.json",
      "is not a draft folder"),
    C("evaluate-draft-is-file", f"evaluate {TARGET} --draft {{chats}} --output {{tmp}}/report.json",
      "is not a draft folder"),
    C("evaluate-draft-corrupt-config", f"evaluate {TARGET} --draft {{tmp}}/d --output {{tmp}}/report.json",
      "is not a draft folder",
      Copy("{draft}", "d", (replace_file("config.json", "{oops"),), "with config.json '{oops'")),
    C("evaluate-draft-is-the-target", f"evaluate {TARGET} --draft {{target}} --output {{tmp}}/report.json",
      "not a DFlash draft"),
    C("evaluate-draft-truncated", f"evaluate {TARGET} --draft {{tmp}}/d --output {{tmp}}/report.json",
      "truncated", Copy("{draft}", "d", (truncate("model.safetensors", -100),), "without its last 100 bytes")),
    C("evaluate-draft-not-safetensors", f"evaluate {TARGET} --draft {{tmp}}/d --output {{tmp}}/report.json",
      "not a safetensors file", Copy("{draft}", "d", (replace_file("model.safetensors", "text"),),
                                     "with a text model.safetensors")),
    C("evaluate-draft-no-weights", f"evaluate {TARGET} --draft {{tmp}}/d --output {{tmp}}/report.json",
      "has no model.safetensors", Copy("{draft}", "d", (remove("model.safetensors"),), "without model.safetensors")),
    C("evaluate-draft-wrong-hidden", f"evaluate {TARGET} --draft {{tmp}}/d --output {{tmp}}/report.json",
      "draft hidden size 96", Copy("{draft}", "d", (set_json("config.json", hidden_size=96),), "with hidden_size 96")),
    C("evaluate-target-truncated-weights", "evaluate --target {tmp}/t --draft {draft} --output "
      "{tmp}/report.json --num-prompts 1", "model.safetensors",
      Copy("{target}", "t", (truncate("model.safetensors", 1000),), "with model.safetensors cut to 1000 bytes")),
    C("evaluate-block-size-100000", f"{EVALUATE} --block-size 100000", "outside 2..16"),
    C("evaluate-block-size-1", f"{EVALUATE} --block-size 1", "evaluate.block_size must be >= 2"),
    C("evaluate-output-is-folder", f"evaluate {TARGET} --draft {{draft}} --output {{tmp}}/r", "is a folder",
      Folder("r")),
    C("evaluate-output-parent-is-file", f"evaluate {TARGET} --draft {{draft}} --output {{tmp}}/f.txt/report.json",
      "is a file", Text("f.txt", "keep me")),
    C("evaluate-bench-unknown", f"{EVALUATE} --bench mmlu", "unknown benchmark 'mmlu'"),
    C("evaluate-bench-twice", f"{EVALUATE} --bench gsm8k gsm8k", "benchmark names repeat"),
    C("evaluate-bench-file-missing", f"{EVALUATE} --bench {{tmp}}/b.jsonl", "b.jsonl"),
    C("evaluate-bench-file-txt", f"{EVALUATE} --bench {{tmp}}/b.txt", "must be .jsonl or .json", Text("b.txt", "hi")),
    C("evaluate-dtype-float77", f"{EVALUATE} --dtype float77", "evaluate.dtype must be one of"),
    C("evaluate-device-tpu", f"{EVALUATE} --device tpu", "device"),
    C("evaluate-top-p-0", f"{EVALUATE} --top-p 0", "evaluate.top_p must be in (0, 1]"),
    C("evaluate-num-prompts-0", f"{EVALUATE} --num-prompts 0", "evaluate.num_prompts must be >= 1"),
    C("evaluate-thinking-yes", f"{EVALUATE} --thinking yes", "expected on or off"),
    C("evaluate-tracking-uri-closed-port", f"{EVALUATE} --tracking-uri http://127.0.0.1:{{closed}}",
      "cannot reach the MLflow server"),
    C("evaluate-target-dtype-float77", f"{EVALUATE} target.dtype=float77", "target.dtype must be one of"),
]

DLLM_CASES = [
    C("dllm-no-output", f"dllm-evaluate --model {{target}} {HELD_OUT}", "evaluate.output is not set"),
    C("dllm-no-held-out-split", "dllm-evaluate --model {target} --output {tmp}/report.json", "needs a held-out split"),
    C("dllm-model-missing", f"dllm-evaluate --model {{tmp}}/nope --output {{tmp}}/report.json {HELD_OUT}",
      "is not a model folder"),
    C("dllm-model-is-file", f"dllm-evaluate --model {{chats}} --output {{tmp}}/report.json {HELD_OUT}",
      "is not a model folder"),
    C("dllm-model-corrupt-config", f"dllm-evaluate --model {{tmp}}/m --output {{tmp}}/report.json {HELD_OUT}",
      "config.json", Copy("{target}", "m", (replace_file("config.json", "{oops"),), "with config.json '{oops'")),
    C("dllm-model-truncated-weights", f"dllm-evaluate --model {{tmp}}/m --output {{tmp}}/report.json {HELD_OUT}",
      "model.safetensors",
      Copy("{target}", "m", (truncate("model.safetensors", 1000),), "with model.safetensors cut to 1000 bytes")),
    C("dllm-output-is-folder", f"dllm-evaluate --model {{target}} --output {{tmp}}/r {HELD_OUT}", "is a folder",
      Folder("r")),
    C("dllm-no-mask-token", "dllm-evaluate --model {target} --output {tmp}/report.json data.train={chats} "
      "data.eval_samples=2", "no mask token"),
    C("dllm-mask-token-out-of-vocab", f"{DLLM} objective.mask_token_id=5000", "5000"),
    C("dllm-steps-0", f"{DLLM} --steps 0", "evaluate.dllm_steps must be >= 1"),
    C("dllm-gen-length-text", f"{DLLM} --gen-length long", "invalid int value"),
    C("dllm-negative-samples", f"{DLLM} --num-samples -1", "evaluate.dllm_samples must be >= 0"),
    C("dllm-prompts-not-list", f"{DLLM} evaluate.prompts=hello", "evaluate.prompts: expected a list"),
    C("dllm-eval-file-missing", f"{DLLM} data.eval={{tmp}}/nope.jsonl", "does not exist"),
    C("dllm-tracking-uri-closed-port", f"{DLLM} tracking.uri=http://127.0.0.1:{{closed}}",
      "cannot reach the MLflow server"),
    C("dllm-target-dtype-float77", f"{DLLM} target.dtype=float77", "target.dtype must be one of"),
]

PROMOTE_CASES = [
    C("promote-no-draft", "promote --report {report} --model-name m --tracking-uri {mlflow}",
      "promote.draft is not set"),
    C("promote-no-model-name", "promote --draft {draft} --report {report} --tracking-uri {mlflow}",
      "promote.model_name is not set"),
    C("promote-no-report", "promote --draft {draft} --model-name m --tracking-uri {mlflow}",
      "promote.report is not set"),
    C("promote-report-missing", f"{PROMOTE_REPORT} {{tmp}}/nope.json", "does not exist"),
    C("promote-report-corrupt", f"{PROMOTE_REPORT} {{tmp}}/r.json", "is not JSON",
      Text("r.json", '{"benchmarks": {')),
    C("promote-report-a-list", f"{PROMOTE_REPORT} {{tmp}}/r.json", "must be a JSON object", Json("r.json", [1, 2])),
    C("promote-report-is-folder", f"{PROMOTE_REPORT} {{tmp}}/r.json", "r.json", Folder("r.json")),
    C("promote-report-no-benchmarks", f"{PROMOTE_REPORT} {{tmp}}/r.json", "no `benchmarks` section",
      Json("r.json", {"settings": {}})),
    C("promote-report-tau-nan", f"{PROMOTE_REPORT} {{tmp}}/r.json", "gsm8k tau is nan",
      Json("r.json", good_report(tau=float("nan")))),
    C("promote-report-tau-infinity-string", f"{PROMOTE_REPORT} {{tmp}}/r.json", "gsm8k tau is 'Infinity'",
      Json("r.json", good_report(tau="Infinity"))),
    C("promote-report-tau-negative", f"{PROMOTE_REPORT} {{tmp}}/r.json", "gsm8k tau is -3",
      Json("r.json", good_report(tau=-3))),
    C("promote-report-tau-above-block", f"{PROMOTE_REPORT} {{tmp}}/r.json", "gsm8k tau is 40",
      Json("r.json", good_report(tau=40))),
    C("promote-report-lossless-1.5", f"{PROMOTE_REPORT} {{tmp}}/r.json", "lossless fraction is 1.5",
      Json("r.json", good_report(lossless=1.5))),
    C("promote-report-speedup-0", f"{PROMOTE_REPORT} {{tmp}}/r.json", "speedup is 0",
      Json("r.json", good_report(speedup=0))),
    C("promote-report-no-tau", f"{PROMOTE_REPORT} {{tmp}}/r.json", "lacks speculative.tau_pooled",
      Json("r.json", {"benchmarks": {"gsm8k": {"lossless": 1.0}}})),
    C("promote-primary-benchmark-absent", f"{PROMOTE} --primary-benchmark humaneval", "humaneval"),
    C("promote-draft-missing", "promote --draft {tmp}/nope --report {report} --model-name m --tracking-uri {mlflow}",
      "is not a draft folder"),
    C("promote-draft-truncated", "promote --draft {tmp}/d --report {report} --model-name m --tracking-uri {mlflow}",
      "truncated", Copy("{draft}", "d", (truncate("model.safetensors", -100),), "without its last 100 bytes")),
    C("promote-draft-wrong-shapes", "promote --draft {tmp}/d --report {report} --model-name m --tracking-uri {mlflow}",
      "does not match its config", Copy("{draft}", "d", (set_json("config.json", intermediate_size=32),),
                                        "with intermediate_size 32 in config.json")),
    C("promote-model-name-quote", ["promote", "--draft", "{draft}", "--report", "{report}", "--model-name", "it's",
                                   "--tracking-uri", "{mlflow}"], "promote.model_name must be letters"),
    C("promote-model-name-slash", f"{PROMOTE_TO} --report {{report}} --model-name team/draft",
      "promote.model_name must be letters"),
    C("promote-min-lossless-2", f"{PROMOTE} --min-lossless 2", "promote.min_lossless must be a fraction in [0, 1]"),
    C("promote-min-tau-gain-negative", f"{PROMOTE} --min-tau-gain -1", "promote.min_tau_gain must be >= 0"),
    C("promote-min-speedup-text", f"{PROMOTE} --min-speedup fast", "invalid float value"),
    C("promote-tracking-closed-port", "promote --draft {draft} --report {report} --model-name m "
      "--tracking-uri http://127.0.0.1:{closed}", "cannot reach the MLflow server"),
    C("promote-tracking-uri-bad-scheme", "promote --draft {draft} --report {report} --model-name m "
      "--tracking-uri nosuch://x", "is not a tracking URI"),
    C("promote-output-is-folder", f"{PROMOTE_TO} --report {{report}} --model-name bad-output --output {{tmp}}/o",
      "is a folder", Folder("o")),
]

LAUNCH_CASES = [
    C("launch-memory-lots", f"{LAUNCH} --memory lots", "--memory 'lots' is not a Kubernetes quantity"),
    C("launch-cpu-words", f"{LAUNCH} --cpu two", "--cpu 'two' is not a Kubernetes quantity"),
    C("launch-shm-size-gb", f"{LAUNCH} --shm-size 16GB", "--shm-size '16GB' is not a Kubernetes quantity"),
    C("launch-name-uppercase", f"{LAUNCH} --name My_Job", "job name 'My_Job'"),
    C("launch-name-too-long", f"{LAUNCH} --name {'a' * 50}", "at most 40"),
    C("launch-namespace-invalid", f"{LAUNCH} --namespace Team.A", "namespace 'Team.A'"),
    C("launch-toleration-no-key", f"{LAUNCH} --toleration :NoSchedule", "expected KEY[=VALUE][:EFFECT]"),
    C("launch-toleration-bad-effect", f"{LAUNCH} --toleration gpu:Sometimes", "effect must be one of"),
    C("launch-toleration-unknown-field", [*LAUNCH.split(), "launch.tolerations=[{key: gpu, colour: red}]"],
      "unknown field(s) ['colour']"),
    C("launch-pvc-no-path", f"{LAUNCH} --pvc data", "expected CLAIM:/mount/path"),
    C("launch-pvc-relative-path", f"{LAUNCH} --pvc data:mnt", "must be absolute"),
    C("launch-pvc-bad-claim", f"{LAUNCH} --pvc Data_Set:/data", "PVC name 'Data_Set'"),
    C("launch-pvc-twice", f"{LAUNCH} --pvc a:/data --pvc b:/data", "used twice"),
    C("launch-env-bad-name", f"{LAUNCH} --env 1BAD=x", "environment variable name '1BAD'"),
    C("launch-env-reserved", f"{LAUNCH} --env RANK=3", "set by the training operator"),
    C("launch-env-no-equals", f"{LAUNCH} --env NOVALUE", "expected KEY=VALUE"),
    C("launch-secret-env-no-key", f"{LAUNCH} --secret-env HF_TOKEN=hf-secret", "expected ENV=SECRET:KEY"),
    C("launch-secret-env-bad-secret", f"{LAUNCH} --secret-env HF_TOKEN=HF_Secret:token", "Secret name"),
    C("launch-node-selector-no-key", f"{LAUNCH} --node-selector =gpu", "expected KEY=VALUE"),
    C("launch-elastic-above-nodes", f"{LAUNCH} --nodes 2 --elastic-min-nodes 3", "between 1 and --nodes"),
    C("launch-elastic-trainjob", "launch --dry-run --backend trainjob --image reg/t:1 --namespace ns "
      "--elastic-min-nodes 1", "PyTorchJob feature"),
    C("launch-no-image", "launch --dry-run --backend pytorchjob --namespace ns", "launch.image is not set"),
    C("launch-image-with-space", ["launch", "--dry-run", "--backend", "pytorchjob", "--image", "reg/t 1",
                                  "--namespace", "ns"], "is not a container image reference"),
    C("launch-cuda-image-no-gpu", "launch --dry-run --backend pytorchjob --image reg/t:cuda12 --namespace ns "
      "--gpus-per-node 0", "CUDA image"),
    C("launch-output-not-on-pvc", f"{LAUNCH} --output-dir /elsewhere/run", "not on a mounted PVC"),
    C("launch-train-output-dir", f"{LAUNCH} train.output_dir=/data/x", "set the output dir with --output-dir"),
    C("launch-backend-slurm", "launch --dry-run --backend slurm", "invalid choice"),
    C("launch-backend-key-slurm", "launch --dry-run launch.backend=slurm", "launch.backend must be one of"),
    C("launch-local-two-nodes", "launch --dry-run --backend local --nodes 2", "local backend runs on this machine"),
    C("launch-procs-with-gpus", "launch --dry-run --backend local --procs-per-node 2", "only for runs without GPUs"),
    C("launch-timeout-0", f"{LAUNCH} --timeout 0", "launch.timeout_s must be >= 1"),
    C("launch-cleanup-sometimes", f"{LAUNCH} --cleanup sometimes", "invalid choice"),
    C("launch-command-evaluate", f"{LAUNCH} --command evaluate", "invalid choice"),
    C("launch-tracking-uri-bad-scheme", f"{LAUNCH.replace('--dry-run ', '')} tracking.uri=nosuch://x",
      "is not a tracking URI", env={"KUBECONFIG": "/nonexistent/kubeconfig"}),
    C("launch-no-kubeconfig", "launch --backend pytorchjob --image reg/t:1 --namespace ns", "Kubernetes credentials",
      env={"KUBECONFIG": "/nonexistent/kubeconfig"}),
    C("launch-local-train-output-is-file", "launch --backend local --gpus-per-node 0 --procs-per-node 2 "
      "target.name_or_path={target} data.train={chats} train.output_dir={tmp}/out.txt", "out.txt is a file",
      Text("out.txt", "keep me"), subprocess=True, timeout=120),
]

RUN_CASES = [
    C("run-pipeline-missing", "run {tmp}/nope.py --local", "does not exist or is not a .py file"),
    C("run-pipeline-yaml", "run {tmp}/p.yaml --local", "is not a .py file", Text("p.yaml", "a: 1\n")),
    C("run-no-local", "run {tmp}/tiny.py", "the following arguments are required: --local", TINY_PIPELINE),
    C("run-pipeline-syntax-error", "run {tmp}/p.py --local", "p.py", Text("p.py", "def broken(:\n", "a syntax error")),
    C("run-pipeline-import-error", "run {tmp}/p.py --local", "p.py",
      Text("p.py", "import no_such_module\n", "imports a missing module")),
    C("run-no-pipeline-in-file", "run {tmp}/p.py --local", "exactly one @dsl.pipeline",
      Text("p.py", "x = 1\n", "no pipeline")),
    C("run-unknown-parameter", f"{RUN} stpes=2", "has no parameter 'stpes'", TINY_PIPELINE),
    C("run-parameter-wrong-type", f"{RUN} steps=two", "expected int", TINY_PIPELINE),
    C("run-parameter-float-text", f"{RUN} rate=fast", "expected float", TINY_PIPELINE),
    C("run-parameter-list-not-list", f"{RUN} names=abc", "expected list", TINY_PIPELINE),
    C("run-argument-no-equals", f"{RUN} steps", "not of the form name=value", TINY_PIPELINE),
    C("run-argument-bad-yaml", f"{RUN} names=[a,", "is not valid YAML", TINY_PIPELINE),
    C("run-profile-unknown", f"{RUN} --profile gpu", "has no profile 'gpu'", TINY_PIPELINE),
    C("run-real-pipeline-bad-override", "run {repo}/pipelines/llada2_sft.py --local model_uri={tmp}/m "
      "dataset_uri={tmp}/d target={target} overrides=[train.lr=fast]", "train.lr", timeout=120),
]

SUBMIT_CASES = [
    C("submit-no-host", "submit {tmp}/tiny.py --experiment e", "the following arguments are required: --host",
      TINY_PIPELINE),
    C("submit-no-experiment", "submit {tmp}/tiny.py --host http://127.0.0.1:{closed}",
      "the following arguments are required: --experiment", TINY_PIPELINE),
    C("submit-pipeline-missing", "submit {tmp}/nope.py --host http://127.0.0.1:{closed} --experiment e",
      "does not exist"),
    C("submit-unreachable-host", SUBMIT, "127.0.0.1", TINY_PIPELINE),
    C("submit-host-not-a-url", "submit {tmp}/tiny.py --host not-a-url --experiment e", "not-a-url", TINY_PIPELINE),
    C("submit-workspace-size-lots", "submit {repo}/pipelines/dflash_nano30b.py --host http://127.0.0.1:{closed} "
      "--experiment e --workspace-size lots", "lots"),
    C("submit-unknown-parameter", f"{SUBMIT} stpes=2", "has no parameter 'stpes'", TINY_PIPELINE),
    C("submit-parameter-wrong-type", f"{SUBMIT} steps=1.5", "expected int", TINY_PIPELINE),
    C("submit-parameter-bool-for-int", f"{SUBMIT} steps=true", "expected int", TINY_PIPELINE),
    C("submit-argument-no-equals", f"{SUBMIT} =3", "not of the form name=value", TINY_PIPELINE),
    C("submit-output-is-folder", f"{SUBMIT} --output {{tmp}}/o", "is a folder", TINY_PIPELINE, Folder("o")),
    C("submit-output-parent-is-file", f"{SUBMIT} --output {{tmp}}/f.txt/p.yaml", "is a file", TINY_PIPELINE,
      Text("f.txt", "keep me")),
    C("submit-pipeline-syntax-error", "submit {tmp}/p.py --host http://127.0.0.1:{closed} --experiment e", "p.py",
      Text("p.py", "def broken(:\n", "a syntax error")),
]

CASES: list[Case] = [
    *DRAFT_INIT_CASES, *WARMUP_CASES, *PREPARE_CASES, *TRAIN_CASES, *EVALUATE_CASES, *DLLM_CASES,
    *PROMOTE_CASES, *LAUNCH_CASES, *RUN_CASES, *SUBMIT_CASES,
]

# -- running a case --------------------------------------------------------------------------------


@dataclass
class Outcome:
    code: int | None  # None: no exit (a traceback or a timeout)
    stdout: str
    stderr: str
    traceback: str | None  # an exception that escaped the command, or "Traceback" in its output
    changes: list[str]  # what the command wrote, removed or changed on disk
    seconds: float
    timed_out: bool = False

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if re.match(r"flashdraft [\w-]+: error: ", line)]


def _tree(root: Path, hashed: bool = True) -> dict[str, tuple]:
    """Every path under `root` (links not followed): kind and, for files, size and content hash (or mtime)."""
    out: dict[str, tuple] = {}
    if not root.exists():
        return out
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = ("link", os.readlink(path))
        elif path.is_dir():
            out[rel] = ("dir",)
        elif hashed:
            out[rel] = ("file", path.stat().st_size, hashlib.sha256(path.read_bytes()).hexdigest())
        else:
            stat = path.stat()
            out[rel] = ("file", stat.st_size, stat.st_mtime_ns)
    return out


def _changes(before: dict, after: dict, where: str) -> list[str]:
    created = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    changed = sorted(k for k in set(before) & set(after) if before[k] != after[k])
    return ([f"{where}: wrote {p}" for p in created] + [f"{where}: removed {p}" for p in removed]
            + [f"{where}: changed {p}" for p in changed])


def _shared_tree(shared: Shared) -> dict[str, tuple]:
    # The tracking store takes FAILED runs of promote cases; the registry is checked on its own.
    return {k: v for k, v in _tree(shared.root, hashed=False).items() if not k.startswith("mlflow")}


def _registered(shared: Shared) -> list[str]:
    """Every model version in the shared tracking store, as NAME/VERSION."""
    from mlflow import MlflowClient

    client = MlflowClient(shared.values["mlflow"], registry_uri=shared.values["mlflow"])
    return [f"{v.name}/{v.version}" for v in client.search_model_versions()]


class _Timeout(BaseException):
    """Raised by the alarm: a BaseException, so that no `except Exception` in the command swallows it."""


@contextlib.contextmanager
def _alarm(seconds: float):
    """Raise _Timeout after `seconds`; an outer alarm (pytest-timeout's) is put back with its time left."""

    def ring(signum, frame):
        raise _Timeout()

    start = time.monotonic()
    previous = signal.signal(signal.SIGALRM, ring)
    outer, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer:
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - start), 0.001))


# Variables a case must not inherit: tracking, distributed and pipeline settings of the caller.
_CLEARED_ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "FLASHDRAFT_PARENT_RUN_ID", "FLASHDRAFT_CACHE",
                "RANK", "WORLD_SIZE", "LOCAL_RANK", "PET_NPROC_PER_NODE", "TORCHELASTIC_RUN_ID", "KFP_NAMESPACE",
                "POD_NAMESPACE", "KUBECONFIG")


@contextlib.contextmanager
def _case_environment(tmp: Path, env: dict[str, str]):
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    for name in _CLEARED_ENV:
        os.environ.pop(name, None)
    os.environ.update({"HOME": str(tmp / "home"), "KUBECONFIG": str(tmp / "no-kubeconfig"), **env})
    os.chdir(tmp)
    try:
        yield
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)


def _in_process(argv: list[str], timeout: float) -> tuple[int | None, str, str, str | None, bool]:
    from flashdraft import cli

    out, err = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(err)  # log records (and their tracebacks) count as the command's stderr
    root = logging.getLogger()
    root.addHandler(handler)
    code, trace, timed_out = None, None, False
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), _alarm(timeout):
            try:
                code = cli.main(argv)
            except SystemExit as exit_:  # argparse
                code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except _Timeout:
        timed_out = True
    except BaseException:  # noqa: BLE001
        trace = traceback.format_exc()  # any exception that escapes the command is the finding
    finally:
        root.removeHandler(handler)
    return code, out.getvalue(), err.getvalue(), trace, timed_out


def _in_subprocess(argv: list[str], timeout: float) -> tuple[int | None, str, str, str | None, bool]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    try:
        done = subprocess.run([sys.executable, "-m", "flashdraft.cli", *argv], capture_output=True, text=True,
                              env=env, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as err:
        stdout = err.stdout.decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
        stderr = err.stderr.decode() if isinstance(err.stderr, bytes) else (err.stderr or "")
        return None, stdout, stderr, None, True
    return done.returncode, done.stdout, done.stderr, None, False


def run_case(case: Case, shared: Shared, tmp: Path) -> Outcome:
    """Set up `case` in the empty folder `tmp`, run it, and say what happened."""
    (tmp / "home").mkdir(parents=True, exist_ok=True)
    for given in case.given:
        given(tmp, shared)
    argv = [_expand(arg, tmp, shared) for arg in case.argv]
    uses_registry = any("{mlflow}" in arg for arg in case.argv)
    before, shared_before = _tree(tmp), _shared_tree(shared)
    versions_before = _registered(shared) if uses_registry else []
    start = time.monotonic()
    with _case_environment(tmp, case.env):
        runner = _in_subprocess if case.subprocess else _in_process
        code, stdout, stderr, trace, timed_out = runner(argv, case.timeout)
    seconds = time.monotonic() - start
    if trace is None and "Traceback (most recent call last)" in stdout + stderr:
        trace = stderr if "Traceback" in stderr else stdout
    changes = _changes(before, _tree(tmp), "case folder") + _changes(shared_before, _shared_tree(shared), "shared")
    if uses_registry:
        changes += [f"registry: registered {v}" for v in _registered(shared) if v not in versions_before]
    return Outcome(code, stdout, stderr, trace, changes, seconds, timed_out)


def _exception_line(trace: str) -> str:
    """The `SomeError: message` line of a traceback (its last one), else the trace's last line."""
    lines = [line.strip() for line in trace.strip().splitlines()]
    raised = [line for line in lines if re.match(r"[\w.]+(Error|Exception|Exit|Interrupt)\b", line)]
    return (raised or lines)[-1]


def problems(case: Case, outcome: Outcome) -> list[str]:
    """What is wrong with `outcome` for a bad input (empty: a clear error and nothing touched)."""
    found = []
    if outcome.timed_out:
        found.append(f"no answer within {case.timeout:.0f} s")
    if outcome.traceback:
        found.append("traceback: " + _exception_line(outcome.traceback)[:300])
    if outcome.code == 0:
        found.append("exit 0: the bad input was accepted")
    elif outcome.code is not None and outcome.code != 2:
        found.append(f"exit code {outcome.code}, not 2")
    if outcome.changes:
        found.append("; ".join(outcome.changes[:6]) + (" ..." if len(outcome.changes) > 6 else ""))
    if outcome.code == 2 and not outcome.traceback:
        prefix = f"flashdraft {case.command}: error: "
        lines = [line for line in outcome.stderr.splitlines() if line.strip()]
        if not lines or not lines[-1].startswith(prefix):
            found.append(f"the last line of stderr is not `{prefix}...`, the error spans several lines or none")
        elif case.expect.lower() not in lines[-1].lower():
            found.append(f"the error does not say {case.expect!r}")
    return found


def error_line(case: Case, outcome: Outcome) -> str:
    """The command's own error line (else the first of another `flashdraft` command, e.g. a torchrun rank's)."""
    lines = outcome.error_lines
    own = [line for line in lines if line.startswith(f"flashdraft {case.command}: error: ")]
    return (own or lines or [""])[0]


# -- the test --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shared(tiny_target, tmp_path_factory) -> Shared:
    warm_imports()
    return make_shared(tmp_path_factory.mktemp("bad-inputs-shared"), tiny_target("qwen3"))




def test_cases_cover_every_command():
    from flashdraft.stages import STAGES

    assert len(CASES) >= 120
    assert len({c.id for c in CASES}) == len(CASES), "case ids repeat"
    assert {c.command for c in CASES} == set(STAGES)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_bad_input_gives_one_clear_error_and_touches_nothing(case: Case, shared: Shared, tmp_path: Path):
    outcome = run_case(case, shared, tmp_path / "case")
    found = problems(case, outcome)
    assert not found, f"{case.shown()}\n" + "\n".join(found) + f"\n--- stderr (tail) ---\n{outcome.stderr[-3000:]}"
