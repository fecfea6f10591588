"""KFP components: one folder each, a thin `component.py` that calls into flashdraft, compiled YAML beside it."""
