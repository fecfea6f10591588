"""flashdraft: train DFlash speculative-decoding drafts."""

__version__ = "0.1.0"
