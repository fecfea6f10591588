"""The default tap rule (reference section 1) and that ids are always written."""

from __future__ import annotations

import json

import pytest

from flashdraft.cli import main
from flashdraft.model import default_target_layer_ids


@pytest.mark.parametrize(
    ("layers", "taps", "expected"),
    [
        (28, 5, [1, 7, 13, 19, 25]),
        (36, 5, [1, 9, 17, 25, 33]),
        (52, 5, [1, 13, 25, 37, 49]),
        (36, 1, [18]),
        (52, 1, [26]),
    ],
)
def test_default_rule_matches_the_reference_table(layers, taps, expected):
    assert default_target_layer_ids(layers, taps) == expected


def test_default_rule_never_taps_the_last_layer():
    for layers in range(4, 80):
        for taps in range(1, 8):
            assert max(default_target_layer_ids(layers, taps)) <= layers - 3 or taps == 1


def test_draft_init_always_writes_the_layer_ids(tiny_target, tmp_path):
    assert main(["draft-init", "--target", str(tiny_target("llama")), "--output", str(tmp_path / "d"),
                 "--num-layers", "1"]) == 0
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    assert config["dflash_config"]["target_layer_ids"] == [3]  # 6 layers, one tap -> L // 2
