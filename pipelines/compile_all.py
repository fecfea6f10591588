"""Regenerate every checked-in compiled YAML: components/*/component.yaml and pipelines/*.yaml.

    python pipelines/compile_all.py            # write them
    python pipelines/compile_all.py --check    # exit 1 if any differs from a fresh compile (CI does this)

Compile with the default images and workspace settings (FLASHDRAFT_* variables unset).
"""

import argparse
import importlib
import sys
import tempfile
from pathlib import Path

import yaml
from kfp import compiler

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

COMPONENTS = ["draft_init", "target_warmup", "prepare_data", "train", "evaluate", "promote", "mlflow_run_start",
              "mlflow_run_end", "dllm_evaluate"]
PIPELINES = ["dflash_nano30b", "llada2_sft"]


def targets():
    """(function or pipeline, checked-in YAML path) for everything compiled."""
    for name in COMPONENTS:
        module = importlib.import_module(f"components.{name}.component")
        yield getattr(module, name), ROOT / "components" / name / "component.yaml"
    for name in PIPELINES:
        module = importlib.import_module(f"pipelines.{name}")
        yield getattr(module, name), ROOT / "pipelines" / f"{name}.yaml"


def same_spec(checked_in: Path, fresh: Path) -> bool:
    """Equal as YAML documents: kfp's header comment lists dict defaults in hash order, so comments may vary."""
    if not checked_in.is_file():
        return False
    return list(yaml.safe_load_all(checked_in.read_text())) == list(yaml.safe_load_all(fresh.read_text()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args()
    stale = []
    with tempfile.TemporaryDirectory() as tmp:
        for func, path in targets():
            fresh = Path(tmp) / path.name
            compiler.Compiler().compile(func, str(fresh))
            if args.check:
                if not same_spec(path, fresh):
                    stale.append(path.relative_to(ROOT))
            else:
                path.write_text(fresh.read_text())
    if stale:
        print("stale compiled YAML (run python pipelines/compile_all.py):", *stale, sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
