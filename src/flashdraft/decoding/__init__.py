"""Speculative decoding with a DFlash draft: the loop, exact rollback for hybrids, metrics, evaluation."""
