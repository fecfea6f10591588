"""Training: the trainer loop, distributed setup (FSDP2), optimizer/schedule, checkpoints, export."""
