"""Model cards are written from data: a fresh and a trained draft differ by one field, not by edited text."""

from __future__ import annotations

import dataclasses

from flashdraft.model import DFlashDraftConfig, DFlashDraftModel
from flashdraft.model.card import DraftCard, FineTuneCard


def test_fresh_and_trained_draft_cards_differ_only_in_the_weights_line():
    config = DFlashDraftConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        intermediate_size=64, vocab_size=50, num_target_layers=8,
        dflash_config={"mask_token_id": 7, "target_layer_ids": [1, 5], "block_size": 4},
    )
    fresh = DraftCard.describe(DFlashDraftModel(config), target="org/target", recipe=None)
    assert fresh.num_parameters > 0 and fresh.target_layer_ids == [1, 5] and not fresh.trained
    trained = dataclasses.replace(fresh, trained=True)
    changed = [(a, b) for a, b in zip(fresh.render().splitlines(), trained.render().splitlines()) if a != b]
    assert changed == [("Made by `flashdraft draft-init`; weights are freshly initialised until trained "
                        "(`flashdraft train`).", "Made by `flashdraft draft-init`; weights are trained with "
                        "`flashdraft train`.")]
    assert "| target layer ids | [1, 5] |" in fresh.render() and "| recipe | none (shapes from the target) |" in (
        fresh.render())


def test_fine_tune_card():
    card = FineTuneCard(name="export", objective="mdlm", base="org/lm", recipe="llada2_sft", mask_token_id=3)
    assert card.render() == ("# export\n\n`mdlm` fine-tune of `org/lm` (recipe `llada2_sft`), trained with "
                             "`flashdraft train`. Mask token id: 3.\n")
