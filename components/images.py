"""The container images components run in, fixed at compile time.

Override with FLASHDRAFT_TRAINER_IMAGE / FLASHDRAFT_RUNTIME_IMAGE when compiling (the checked-in YAML
uses the defaults). The trainer image has CUDA, torch and flashdraft; the runtime image has flashdraft
with MLflow but no CUDA, for steps that only talk to the registry.
"""

import os

TRAINER_IMAGE = os.environ.get("FLASHDRAFT_TRAINER_IMAGE", "ghcr.io/flashdraft/flashdraft-trainer:0.1.0-cuda12.8")
RUNTIME_IMAGE = os.environ.get("FLASHDRAFT_RUNTIME_IMAGE", "ghcr.io/flashdraft/flashdraft-runtime:0.1.0")
