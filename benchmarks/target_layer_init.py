"""An experiment for issue 22: a draft whose decoder layers start as copies of the target's last layers.

    python benchmarks/target_layer_init.py --draft FRESH --target TARGET --out DIR [--layers 26,27,28,29]

then train with `draft.init_from=DIR`. FRESH is a `flashdraft draft-init` folder for TARGET (an HF folder).
Draft layer i takes target layer `layers[i]`'s attention projections, MLP and both layer norms (default:
the target's last layers, one per draft layer), and the draft's final norm the target's. What the target
has no counterpart for keeps FRESH's initialisation: `fc` and `hidden_norm` (the tapped features' fusion)
and the per-head q/k norms (a Llama target has none; a Qwen3 target's are copied too).

Why: at the quality runs' scale (a few thousand answers, hundreds of steps) the drafts are far from fitting
the target (held-out slot-1 accuracy ~0.22, RESULTS.md section 8); trained layers of the target are a
better start than random ones if the step from the target's features to its next tokens resembles the
target's own last layers. `init.json` in DIR lists which tensors were copied and which kept.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from flashdraft.errors import UserError
from flashdraft.files import atomic_dir, check_output_dir, holds_only
from flashdraft.model.check import check_draft
from flashdraft.model.modeling import DFlashDraftModel
from flashdraft.stages.args import comma_ints
from flashdraft.target.frozen import decoder_layers

WRITTEN = ("config.json", "model.safetensors", "README.md", "generation_config.json", "init.json")


def copy_target_layers(draft: DFlashDraftModel, target: torch.nn.Module, layers: list[int]) -> dict[str, list[str]]:
    """Copy target layer layers[i] into draft layer i (tensors of the same name and shape) and the target's
    final norm into the draft's; {"copied": [...], "kept": [...]} names the draft tensors either way."""
    source = decoder_layers(target)
    if len(layers) != len(draft.layers):
        raise UserError(f"--layers names {len(layers)} target layers for a draft of {len(draft.layers)} layers; "
                        "give one target layer per draft layer")
    bad = [i for i in layers if not 0 <= i < len(source)]
    if bad:
        raise UserError(f"--layers {bad} are not layers of the target, which has {len(source)} (0 to "
                        f"{len(source) - 1})")
    not_attention = [j for j in layers if "self_attn.q_proj.weight" not in source[j].state_dict()]
    if not_attention:
        raise UserError(f"the target's layers {not_attention} have no attention projections named like the draft's "
                        "(self_attn.q_proj ...); only attention layers of a Llama- or Qwen-like target can be copied")
    pairs = [(f"layers.{i}.", draft_layer, source[j]) for i, (draft_layer, j) in enumerate(zip(draft.layers, layers))]
    final_norm = getattr(target.get_decoder(), "norm", None)
    if final_norm is not None:
        pairs.append(("norm.", draft.norm, final_norm))
    copied = []
    with torch.no_grad():
        for prefix, ours, theirs in pairs:
            theirs_state = theirs.state_dict()
            for name, tensor in ours.state_dict().items():
                other = theirs_state.get(name)
                if other is None:
                    continue
                if other.shape != tensor.shape:
                    raise UserError(f"draft tensor {prefix}{name} has shape {list(tensor.shape)}, the target's "
                                    f"{list(other.shape)}: copying needs a draft of the target's layer sizes "
                                    "(draft-init without hidden_size / intermediate_size / head overrides)")
                tensor.copy_(other.to(tensor.dtype))
                copied.append(prefix + name)
    kept = set(draft.state_dict()) - set(copied)
    return {"copied": copied, "kept": sorted(kept)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--draft", type=Path, required=True, help="a `flashdraft draft-init` folder for the target")
    parser.add_argument("--target", type=Path, required=True, help="the target's HF folder")
    parser.add_argument("--out", type=Path, required=True, help="the new draft folder")
    parser.add_argument("--layers", type=comma_ints, help="target layers, one per draft layer (default: the last)")
    args = parser.parse_args(argv)
    try:
        out = check_output_dir(args.out, "target_layer_init", flag="--out", overwrite=None,
                               produced=holds_only(*WRITTEN))
        check_draft(args.draft, "--draft")
        if not (args.target / "config.json").is_file():
            raise UserError(f"--target {args.target} is not an HF model folder (no config.json)")
        draft = DFlashDraftModel.from_pretrained(args.draft, dtype=torch.float32)
        target = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32)
        count = len(decoder_layers(target))
        layers = args.layers or list(range(count - len(draft.layers), count))
        record = {"target": str(args.target), "fresh_draft": str(args.draft), "layers": layers,
                  **copy_target_layers(draft, target, layers)}
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    with atomic_dir(out) as tmp:
        draft.save_pretrained(tmp, safe_serialization=True)
        if (args.draft / "README.md").is_file():  # the fresh draft's card: its shape and target still hold
            shutil.copy(args.draft / "README.md", tmp / "README.md")
        (tmp / "init.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"draft with target layers {layers} written to {out} ({len(record['copied'])} tensors copied)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
