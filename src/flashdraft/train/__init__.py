"""Training: the trainer loop, distributed setup (FSDP2), optimizer/schedule, checkpoints, and the weights
an objective trains (loaded and exported in models.py)."""
