"""benchmarks/answer_loops.py: the share of answer tokens inside verbatim loops."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import answer_loops  # noqa: E402

from flashdraft.data.repetition import LOOP_WINDOW  # noqa: E402


def test_loops_are_counted_per_answer_and_split_by_how_the_answer_ended():
    phrase = list(range(100, 140))  # 40 distinct tokens
    rows = [
        # a loop cut by the limit; the answer is the LAST assistant turn, not the earlier one
        {"finish_reason": "length", "messages": [{"role": "user", "content": "a"},
                                                 {"role": "assistant", "content": "distinct"},
                                                 {"role": "user", "content": "b"},
                                                 {"role": "assistant", "content": "loop"}]},
        {"finish_reason": "stop", "messages": [{"role": "user", "content": "c"},
                                               {"role": "assistant", "content": "distinct"}]},
    ]
    answers = {"loop": phrase * 4, "distinct": list(range(1000, 1100))}
    shares = answer_loops.answer_loops(rows, answers.__getitem__, first=80)
    looped = 160 - 40 - (LOOP_WINDOW - 1)  # every token after the first period and a window's head
    assert shares["cut at the limit"] == {"answers": 1, "tokens": 160, "looped_share": round(looped / 160, 4)}
    assert shares["stopped"] == {"answers": 1, "tokens": 100, "looped_share": 0.0}
    assert shares["all"]["tokens"] == 260 and shares["all"]["looped_share"] == round(looped / 260, 4)
    # the first 80 tokens of the loop hold one repeat period: 80 - 40 - 31 looped tokens
    assert shares["first 80 tokens"] == {"answers": 2, "tokens": 160, "looped_share": round((80 - 40 - 31) / 160, 4)}
