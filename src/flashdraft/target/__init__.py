"""The target LM: its source and config (source), hybrid-layer kernels (fast_path), the frozen model
(frozen), and its materialisation as a plain HF folder (cache)."""
