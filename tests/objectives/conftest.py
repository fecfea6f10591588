"""Tiny saved diffusion LMs for the objective tests."""

from __future__ import annotations

import pytest

from diffusion_helpers import save_model


@pytest.fixture(scope="module")
def bidirectional_model(tmp_path_factory):
    return save_model(tmp_path_factory.mktemp("bidir"), bidirectional=True)


@pytest.fixture(scope="module")
def causal_model(tmp_path_factory):
    return save_model(tmp_path_factory.mktemp("causal"), bidirectional=False)
