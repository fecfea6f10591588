"""Chat tokenisation with assistant-only loss masks, and the step-indexed loader."""

from __future__ import annotations


import datasets
import pytest

from flashdraft.data.chat import tokenize_chat
from flashdraft.data.loader import StepLoader, eval_batches
from flashdraft.errors import UserError
from tiny_models import CHAT, tiny_tokenizer


# Like Qwen3's template: reasoning of earlier assistant turns is dropped once a later user turn follows.
DROPS_OLD_REASONING = (
    "{% set ns = namespace(last=-1) %}{% for m in messages %}{% if m['role'] == 'user' %}"
    "{% set ns.last = loop.index0 %}{% endif %}{% endfor %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['role'] == 'assistant' and loop.index0 < ns.last %}"
    "{{ m['content'].split('</think>')[-1] }}{% else %}{{ m['content'] }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def supervised_text(tokenizer, messages, max_length=1000) -> str:
    ids, mask = tokenize_chat(tokenizer, messages, max_length)
    assert len(ids) == len(mask)
    return tokenizer.decode([i for i, m in zip(ids, mask) if m])


def test_loss_only_on_assistant_turns():
    tok = tiny_tokenizer()
    assert supervised_text(tok, CHAT) == "hello!<|im_end|>\nbye<|im_end|>\n"


def test_truncation_keeps_the_start():
    tok = tiny_tokenizer()
    full_ids, full_mask = tokenize_chat(tok, CHAT, 1000)
    ids, mask = tokenize_chat(tok, CHAT, 40)
    assert ids == full_ids[:40] and mask == full_mask[:40]


def test_template_that_rewrites_history():
    tok = tiny_tokenizer(DROPS_OLD_REASONING)
    chat = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "<think>hmm</think>a1"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "<think>ok</think>a2"},
    ]
    # The first reply appears without its reasoning in the full text; the last keeps it.
    assert supervised_text(tok, chat) == "a1<|im_end|>\n<think>ok</think>a2<|im_end|>\n"


def test_packaged_smollm2_template():
    from flashdraft.target.source import load_tokenizer

    tok = load_tokenizer("packaged:smollm2")
    # SmolLM2's template adds its own system prompt when none is given; only replies are supervised.
    assert supervised_text(tok, CHAT[1:]) == "hello!<|im_end|>\nbye<|im_end|>\n"


def numbered(n: int) -> datasets.Dataset:
    """Row i holds i + 1 tokens, all equal to i, so a batch reveals which samples it holds."""
    return datasets.Dataset.from_list(
        [{"input_ids": [i] * (i % 7 + 3), "loss_mask": [True] * (i % 7 + 3)} for i in range(n)]
    ).with_format("torch")


def step_samples(loader: StepLoader, step: int) -> list[int]:
    return [i for b in loader.micro_batches(step) for i in b.sample_ids.tolist()]


def test_loader_shards_shuffles_and_resumes():
    data = numbered(50)
    whole = StepLoader(data, micro_batch=4, accum=1, rank=0, world=1, seed=3, pad_id=0)
    assert whole.steps_per_epoch == 12
    # 2 micro x 2 accumulation and 2 ranks x 1 x 2 read exactly the same samples per step.
    accum = StepLoader(data, micro_batch=2, accum=2, rank=0, world=1, seed=3, pad_id=0)
    ranks = [StepLoader(data, micro_batch=1, accum=2, rank=r, world=2, seed=3, pad_id=0) for r in (0, 1)]
    for step in (0, 5, 13):
        expected = sorted(step_samples(whole, step))
        assert sorted(step_samples(accum, step)) == expected
        assert sorted(step_samples(ranks[0], step) + step_samples(ranks[1], step)) == expected
    # One epoch visits distinct samples; the next epoch is a different order; a fresh loader (resume)
    # reproduces any step.
    epoch0 = [i for s in range(12) for i in step_samples(whole, s)]
    assert len(set(epoch0)) == 48
    assert epoch0[:8] != [i for s in (12, 13) for i in step_samples(whole, s)]
    fresh = StepLoader(data, micro_batch=4, accum=1, rank=0, world=1, seed=3, pad_id=0)
    assert step_samples(fresh, 17) == step_samples(whole, 17)
    batch = whole.micro_batches(0)[0]
    for row, sample in enumerate(batch.sample_ids.tolist()):
        length = sample % 7 + 3
        assert batch.attention_mask[row].sum() == length and (batch.input_ids[row, :length] == sample).all()


def test_loader_errors_and_eval_split():
    with pytest.raises(UserError, match="fewer than one global batch"):
        StepLoader(numbered(3), micro_batch=2, accum=1, rank=0, world=2, seed=0, pad_id=0)
    whole = eval_batches(numbered(11), micro_batch=2, rank=0, world=1, pad_id=0)
    for world in (2, 3, 12):
        shards = [eval_batches(numbered(11), micro_batch=2, rank=r, world=world, pad_id=0, pad_to_multiple=8)
                  for r in range(world)]
        assert len({len(s) for s in shards}) == 1  # the same number of forwards on every rank
        assert all(b.input_ids.shape[1] % 8 == 0 for s in shards for b in s)
        # Every sample is supervised exactly once over the ranks, with the same tokens as on one rank;
        # the blank rows that even out the ranks supervise nothing.
        supervised = sorted((int(i), int(m.sum())) for s in shards for b in s
                            for i, m in zip(b.sample_ids, b.loss_mask) if m.any())
        assert supervised == sorted((int(i), int(m.sum())) for b in whole for i, m in zip(b.sample_ids, b.loss_mask))
        assert len(supervised) == 11
