"""Conversation formats: one row of a dataset -> OpenAI-style messages.

    messages   {"messages": [{"role", "content"}, ...]}                       (OpenAI chat)
    sharegpt   {"conversations": [{"from", "value"}, ...]}                     (ShareGPT, Vicuna)
    alpaca     {"instruction", "input" (optional), "output"}                   (Alpaca, Dolly-style)
    prompt     {"prompt" | "question" | "instruction" | "input": str, optional "response" | "output" |
               "completion" | "answer": str}                                   (prompt-only rows, e.g. for warmup)

A source's format is detected from its columns (the first rule that matches, in the order above), or
forced with `data.format`. ShareGPT roles: human / user -> user; gpt / chatgpt / bing / bard / assistant
-> assistant; system -> system. Assistant turns before the first user turn are dropped (they answer
nothing; a system prompt stays), and so is a conversation with no user turn.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from flashdraft.errors import UserError

FORMATS = ("messages", "sharegpt", "alpaca", "prompt")
ROLES = ("system", "user", "assistant")
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
                  "bing": "assistant", "bard": "assistant", "system": "system"}
PROMPT_KEYS = ("prompt", "question", "instruction", "input")
ANSWER_KEYS = ("response", "output", "completion", "answer")


# Rows of these kinds are dropped (and counted) always; other bad rows are errors unless data.skip_bad_rows.
EXPECTED_DROPS = frozenset({"empty_conversation"})


class BadRow(ValueError):
    """A row that cannot become a conversation; `kind` names the reason for the drop counts."""

    def __init__(self, kind: str, detail: str):
        super().__init__(detail)
        self.kind = kind


def detect_format(columns: Iterable[str]) -> str:
    """The format of a source with these columns; a UserError when none fits."""
    names = set(columns)
    if "messages" in names:
        return "messages"
    if "conversations" in names:
        return "sharegpt"
    if {"instruction", "output"} <= names:
        return "alpaca"
    if names & set(PROMPT_KEYS):
        return "prompt"
    raise UserError(
        f"no conversation format fits the columns {', '.join(sorted(names)) or 'none'}: expected 'messages' "
        "(OpenAI), 'conversations' (ShareGPT), 'instruction' + 'output' (Alpaca) or a 'prompt' column; "
        "or force one with data.format=" + "|".join(FORMATS)
    )


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise BadRow("bad_content", f"{what} must be a string, got {value!r:.80}")
    return value


def _turns(row: Mapping, column: str, role_key: str, text_key: str, roles: Mapping[str, str]) -> list[dict]:
    """The list of turns in `column`, each {role_key, text_key}, with roles mapped through `roles`."""
    raw = row.get(column)
    if not isinstance(raw, list):
        raise BadRow("bad_shape", f"'{column}' must be a list of {{{role_key}, {text_key}}}")
    messages = []
    for turn in raw:
        if not isinstance(turn, Mapping) or role_key not in turn or text_key not in turn:
            raise BadRow("bad_shape", f"every turn needs '{role_key}' and '{text_key}', got {turn!r:.120}")
        role = roles.get(str(turn[role_key]).lower())
        if role is None:
            raise BadRow("bad_role", f"role {turn[role_key]!r} is not one of {', '.join(roles)}")
        messages.append({"role": role, "content": _text(turn[text_key], f"'{text_key}'")})
    return messages


def _from_messages(row: Mapping) -> list[dict]:
    return _turns(row, "messages", "role", "content", {role: role for role in ROLES})


def _from_sharegpt(row: Mapping) -> list[dict]:
    messages = _turns(row, "conversations", "from", "value", SHAREGPT_ROLES)
    first_user = next((i for i, m in enumerate(messages) if m["role"] == "user"), None)
    if first_user is None:
        raise BadRow("empty_conversation", "the conversation has no human turn")
    # Assistant turns before the first human turn answer nothing: drop them, keep a system prompt.
    return [m for m in messages[:first_user] if m["role"] == "system"] + messages[first_user:]


def _from_alpaca(row: Mapping) -> list[dict]:
    instruction = _text(row.get("instruction"), "'instruction'")
    extra = row.get("input")
    if extra is not None and _text(extra, "'input'").strip():
        instruction = f"{instruction}\n\n{extra}"
    messages = [{"role": "user", "content": instruction}]
    output = row.get("output")
    if output is not None and _text(output, "'output'"):
        messages.append({"role": "assistant", "content": output})
    return messages


def _from_prompt(row: Mapping) -> list[dict]:
    key = next((k for k in PROMPT_KEYS if isinstance(row.get(k), str)), None)
    if key is None:
        raise BadRow("bad_shape", f"no prompt string in this row (keys: {', '.join(map(str, row)) or 'none'})")
    messages = [{"role": "user", "content": row[key]}]
    answer = next((k for k in ANSWER_KEYS if isinstance(row.get(k), str)), None)
    if answer is not None:
        messages.append({"role": "assistant", "content": row[answer]})
    return messages


_READERS = {"messages": _from_messages, "sharegpt": _from_sharegpt, "alpaca": _from_alpaca, "prompt": _from_prompt}


def to_messages(row: Mapping, format: str) -> list[dict]:
    """The row as OpenAI messages; raises BadRow (with the reason) when it cannot be one."""
    messages = _READERS[format](row)
    if not messages or not any(m["role"] == "user" for m in messages):
        raise BadRow("no_user_turn", "the conversation has no user turn")
    return messages
