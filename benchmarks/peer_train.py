"""`flashdraft train` with the peer's objective (SpecForge 0.2.0's DFlash wrapper, peer_objective.py) or
the distillation experiment (distill_objective.py).

Takes exactly `flashdraft train`'s arguments; add `objective.name=specforge` to train the peer,
`objective.name=distill` for the experiment. The data
order, draft, FSDP2, optimizer, schedule, checkpoints and z-lab export are flashdraft's, so a run with
`objective.name=dflash` and one with `specforge` differ only in the objective. One GPU or several:

    torchrun --nproc-per-node 1 benchmarks/peer_train.py --config smollm2_135m_dflash objective.name=specforge \
        train.output_dir=runs/peer ...

Needs `pip install --no-deps specforge==0.2.0`.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from flashdraft.cli import main  # noqa: E402
from flashdraft.objectives import OBJECTIVES  # noqa: E402

OBJECTIVES["specforge"] = "peer_objective:SpecForgeObjective"
OBJECTIVES["distill"] = "distill_objective:DistillObjective"

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
