"""Chat datasets by name: local files, hub datasets and packaged offline sources -> rows of `messages`.

A dataset spec is one string; a list of specs is a mixture.

    SPEC    := SOURCE [ "@" WEIGHT ]
    SOURCE  := FILE                         a local .jsonl / .json / .parquet file
             | "packaged:" NAME             packaged, offline: reasoning_gym | stdlib_code | word_problems | chitchat
             | ORG "/" NAME [ "/" CONFIG ] [ ":" SPLIT ]     a hub dataset (split defaults to train)

Examples: `prompts.jsonl`, `packaged:chitchat@0.3`, `HuggingFaceH4/ultrachat_200k:train_sft`,
`nvidia/Nemotron-Post-Training-Dataset-v2:chat@0.5`, `org/name/config:test`, `org/name:train[:10%]`
(a hub split takes `datasets`' slice syntax).

Every row comes out as `{"id", "source", "messages"}` with OpenAI-style messages (`role` in system /
user / assistant, `content` a string). Rows in a file or hub dataset may hold `messages`, ShareGPT
`conversations` (`from`/`value`), or a single-turn `prompt` / `instruction` / `question` column with an
optional `response` / `output` / `completion` / `answer`.

Mixtures: either no spec carries a weight (the sources are concatenated, so each counts with its size)
or all do (each source gets the share WEIGHT / sum of weights). With a `limit` the mixture has `limit`
rows, split by share with largest-remainder rounding; without one it is as large as it can be without
repeating a row. The rows of each source are a seeded random subset (all rows if it is used whole); a
single source keeps its own order, a mixture is interleaved in a seeded random order. The same specs,
split, limit and seed always give the same dataset.

Packaged sources, which need no hub:
- `packaged:reasoning_gym`: procedurally generated problems from the `reasoning-gym` package, seeded
  (arithmetic, chain sums, equations, fractions, time and calendar questions, counting, sorting, ...).
  Being generated, they are disjoint from the evaluation sets (GSM8K, HumanEval) by construction; the
  `gsm_symbolic` generator is left out on purpose, because its templates are rewrites of GSM8K test
  questions.
- `packaged:stdlib_code`: "write the body of this function" prompts, one per documented public
  function or method of the running Python's standard library (3,985 on Python 3.11; the exact set depends
  on the Python version). The prompt is the signature and docstring. HumanEval's problems are not in the
  standard library, so the two are disjoint.
- `packaged:word_problems`: grade-school arithmetic word problems from flashdraft's own templates
  (`flashdraft.data.word_problems`), seeded; GSM8K-like in form, sharing none of its questions. Its EVAL
  split names protagonists that TRAIN never uses, so the two share no question.
- `packaged:chitchat`: the `chitchat-dataset` package's human conversations as alternating user /
  assistant turns. The conversation at position i in sorted-key order belongs to the EVAL split when
  i % 10 == 0 and to TRAIN otherwise; training and warmup only ever read TRAIN.
"""

from __future__ import annotations

import ast
import copy as copy_module
import functools
import json
import math
import random
import re
import sysconfig
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import datasets

from flashdraft.data.word_problems import word_problem
from flashdraft.errors import UserError

PACKAGED_PREFIX = "packaged:"
FILE_SUFFIXES = (".jsonl", ".json", ".parquet")
SPLITS = ("train", "eval")
ROLES = ("system", "user", "assistant")

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
# How many problems `packaged:reasoning_gym` / `packaged:word_problems` hold (or the limit, when larger).
REASONING_GYM_SIZE = 10_000
WORD_PROBLEMS_SIZE = 10_000
CHITCHAT_EVAL_EVERY = 10

_HUB = re.compile(r"^(?P<repo>[\w.-]+/[\w.-]+)(?:/(?P<config>[\w.-]+))?(?::(?P<split>[\w.\[\]%:-]+))?$")
_SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                   "system": "system", "chatgpt": "assistant", "bing": "assistant", "bard": "assistant"}
_PROMPT_KEYS = ("prompt", "instruction", "question", "input")
_ANSWER_KEYS = ("response", "output", "completion", "answer")


@dataclass(frozen=True)
class DatasetSpec:
    """One parsed spec: `kind` is file, packaged or hub."""

    text: str
    kind: str
    name: str
    config: str | None = None
    split: str | None = None
    weight: float | None = None


def parse_spec(text: str) -> DatasetSpec:
    """Parse one dataset spec (see the module docstring); a UserError names what is wrong."""
    spec = text.strip()
    weight = None
    if "@" in spec:
        spec, _, raw = spec.rpartition("@")
        try:
            weight = float(raw)
        except ValueError:
            raise UserError(f"dataset spec {text!r}: weight {raw!r} after '@' is not a number") from None
        if not (weight > 0 and math.isfinite(weight)):
            raise UserError(f"dataset spec {text!r}: weight must be a positive number, got {raw}")
    if not spec:
        raise UserError("empty dataset spec; give a .jsonl/.json/.parquet file, packaged:NAME or org/name")
    if spec.startswith(PACKAGED_PREFIX):
        name = spec[len(PACKAGED_PREFIX) :]
        if name not in _PACKAGED:
            raise UserError(f"unknown packaged dataset {name!r}; known: {', '.join(_PACKAGED)}")
        return DatasetSpec(text, "packaged", name, weight=weight)
    if spec.endswith(FILE_SUFFIXES) or Path(spec).expanduser().exists():
        path = Path(spec).expanduser()
        if not path.is_file():
            raise UserError(f"dataset file {spec!r} does not exist")
        if not spec.endswith(FILE_SUFFIXES):
            raise UserError(f"dataset file {spec!r} must end in {', '.join(FILE_SUFFIXES)}")
        return DatasetSpec(text, "file", str(path), weight=weight)
    match = _HUB.match(spec)
    if not match:
        raise UserError(
            f"dataset spec {text!r} is neither an existing file, packaged:NAME, nor a hub id "
            "org/name[/config][:split]"
        )
    return DatasetSpec(
        text, "hub", match["repo"], match["config"], match["split"] or "train", weight=weight
    )


def load_chat_dataset(
    spec: str | Sequence[str], split: str = "train", limit: int | None = None, seed: int = 0
) -> datasets.Dataset:
    """Rows `{"id", "source", "messages"}` for one spec or a mixture (see the module docstring).

    `split` picks the partition of the packaged sources ("train" or "eval"; only `packaged:chitchat` and
    `packaged:word_problems` have an eval partition). Files and hub datasets are used as the spec names them.
    """
    if split not in SPLITS:
        raise UserError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if limit is not None and limit < 1:
        raise UserError(f"limit must be a positive number of rows, got {limit}")
    texts = [spec] if isinstance(spec, str) else list(spec)
    if not texts:
        raise UserError("no dataset spec given")
    specs = [parse_spec(t) for t in texts]
    weighted = [s.weight is not None for s in specs]
    if any(weighted) and not all(weighted):
        raise UserError(
            "give a weight (@W) to every spec of a mixture or to none: " + ", ".join(texts)
        )
    if split == "eval":
        bad = [s.text for s in specs if not (s.kind == "packaged" and s.name in EVAL_SPLIT_SOURCES)]
        if bad:
            raise UserError(
                f"only {' and '.join('packaged:' + n for n in EVAL_SPLIT_SOURCES)} have an eval split; "
                f"{', '.join(bad)} are used as their spec names them"
            )
    sources = [_Source.open(s, split, seed, limit) for s in specs]
    counts = _shares(sources, limit, all(weighted))
    rows: list[dict] = []
    for index, (source, count) in enumerate(zip(sources, counts)):
        rows.extend(source.take(count, random.Random(f"{seed}/{index}")))
    if len(sources) > 1:
        random.Random(f"{seed}/mix").shuffle(rows)
    if not rows:
        raise UserError(f"dataset {', '.join(texts)} has no rows")
    return datasets.Dataset.from_list(rows)


def chitchat_eval_prompts(limit: int | None = None, turns: int = 1) -> list[list[dict]]:
    """Chat prompts from the EVAL split of `packaged:chitchat`, in sorted-key order.

    Each prompt holds a conversation's first `turns` user turns with the human replies between them,
    so it ends with a user turn for the model to answer. Conversations with fewer user turns are
    skipped. These conversations never appear in training or warmup data.
    """
    if turns < 1:
        raise UserError(f"turns must be at least 1, got {turns}")
    prompts: list[list[dict]] = []
    for _, messages in _chitchat_conversations("eval"):
        user_seen = 0
        for end, message in enumerate(messages):
            user_seen += message["role"] == "user"
            if user_seen == turns and message["role"] == "user":
                prompts.append(messages[: end + 1])
                break
        if limit is not None and len(prompts) == limit:
            break
    return prompts


def normalize_messages(row: dict, where: str) -> list[dict]:
    """OpenAI messages from a row in any of the accepted layouts; a UserError says which row is bad."""
    if "messages" in row:
        raw = row["messages"]
        if not isinstance(raw, list):
            raise UserError(f"{where}: 'messages' must be a list of {{role, content}}")
        messages = []
        for message in raw:
            if not isinstance(message, dict) or "role" not in message or "content" not in message:
                raise UserError(f"{where}: every message needs 'role' and 'content', got {message!r:.120}")
            messages.append({"role": message["role"], "content": message["content"]})
    elif "conversations" in row:
        raw = row["conversations"]
        if not isinstance(raw, list):
            raise UserError(f"{where}: 'conversations' must be a list of {{from, value}}")
        messages = []
        for turn in raw:
            role = _SHAREGPT_ROLES.get(str(turn.get("from", "")).lower()) if isinstance(turn, dict) else None
            if role is None:
                raise UserError(f"{where}: unknown ShareGPT turn {turn!r:.120} (from: human/gpt/system)")
            messages.append({"role": role, "content": turn.get("value")})
    else:
        prompt_key = next((k for k in _PROMPT_KEYS if isinstance(row.get(k), str)), None)
        if prompt_key is None:
            raise UserError(
                f"{where}: no chat in this row (keys: {', '.join(map(str, row)) or 'none'}); give "
                "'messages' [{role, content}], ShareGPT 'conversations', or a 'prompt' string"
            )
        messages = [{"role": "user", "content": row[prompt_key]}]
        answer_key = next((k for k in _ANSWER_KEYS if isinstance(row.get(k), str)), None)
        if answer_key is not None:
            messages.append({"role": "assistant", "content": row[answer_key]})
    for message in messages:
        if message["role"] not in ROLES:
            raise UserError(f"{where}: role {message['role']!r} is not one of {', '.join(ROLES)}")
        if not isinstance(message["content"], str):
            raise UserError(f"{where}: message content must be a string, got {message['content']!r:.80}")
    if not any(m["role"] == "user" for m in messages):
        raise UserError(f"{where}: the conversation has no user turn")
    return messages


class _Source:
    """A source of `size` rows; `take(n, rng)` materialises a seeded choice of n of them."""

    def __init__(self, spec: DatasetSpec, size: int):
        self.spec = spec
        self.size = size

    @staticmethod
    def open(spec: DatasetSpec, split: str, seed: int, limit: int | None) -> _Source:
        if spec.kind == "packaged":
            return _PACKAGED[spec.name](spec, split, seed, limit)
        rows = _read_file(spec) if spec.kind == "file" else _read_hub(spec)
        return _ListSource(spec, rows)

    def take(self, count: int, rng: random.Random) -> list[dict]:
        raise NotImplementedError


def _sample_in_order(items: list, count: int, rng: random.Random) -> list:
    """`count` of `items` chosen by `rng`, in their original order (all of them when count covers it)."""
    if count == len(items):
        return items
    return [items[i] for i in sorted(rng.sample(range(len(items)), count))]


class _ListSource(_Source):
    def __init__(self, spec: DatasetSpec, rows: list[dict]):
        super().__init__(spec, len(rows))
        self.rows = rows

    def take(self, count: int, rng: random.Random) -> list[dict]:
        return _sample_in_order(self.rows, count, rng)


class _ReasoningGym(_Source):
    def __init__(self, spec: DatasetSpec, split: str, seed: int, limit: int | None):
        super().__init__(spec, max(REASONING_GYM_SIZE, limit or 0))
        self.seed = seed

    def take(self, count: int, rng: random.Random) -> list[dict]:
        try:
            import reasoning_gym
        except ImportError:
            raise UserError(
                "packaged:reasoning_gym needs the reasoning-gym package: pip install reasoning-gym"
            ) from None
        n_tasks = len(REASONING_GYM_TASKS)
        per_task = -(-count // n_tasks)
        generators = [
            # reasoning-gym seeds item i with seed + i: space the task seeds far apart.
            reasoning_gym.create_dataset(task, seed=(self.seed * n_tasks + t) * 10_000_019, size=per_task)
            for t, task in enumerate(REASONING_GYM_TASKS)
        ]
        rows = []
        for i in range(count):
            task, generator = REASONING_GYM_TASKS[i % n_tasks], generators[i % n_tasks]
            item = generator[i // n_tasks]
            rows.append({
                "id": f"reasoning_gym/{task}/{self.seed}/{i // n_tasks}",
                "source": self.spec.text,
                "messages": [{"role": "user", "content": item["question"]}],
            })
        return rows


class _Chitchat(_Source):
    def __init__(self, spec: DatasetSpec, split: str, seed: int, limit: int | None):
        self.conversations = _chitchat_conversations(split)
        super().__init__(spec, len(self.conversations))

    def take(self, count: int, rng: random.Random) -> list[dict]:
        picked = _sample_in_order(self.conversations, count, rng)
        return [{"id": f"chitchat/{key}", "source": self.spec.text, "messages": m} for key, m in picked]


class _StdlibCode(_Source):
    def __init__(self, spec: DatasetSpec, split: str, seed: int, limit: int | None):
        self.stubs = _stdlib_stubs()
        super().__init__(spec, len(self.stubs))

    def take(self, count: int, rng: random.Random) -> list[dict]:
        return [{"id": f"stdlib_code/{key}", "source": self.spec.text,
                 "messages": [{"role": "user", "content": STDLIB_CODE_PROMPT.format(stub=stub)}]}
                for key, stub in _sample_in_order(self.stubs, count, rng)]


class _WordProblems(_Source):
    def __init__(self, spec: DatasetSpec, split: str, seed: int, limit: int | None):
        super().__init__(spec, max(WORD_PROBLEMS_SIZE, limit or 0))
        self.split, self.seed = split, seed

    def take(self, count: int, rng: random.Random) -> list[dict]:
        return [{"id": f"word_problems/{self.split}/{self.seed}/{i}", "source": self.spec.text,
                 "messages": [{"role": "user", "content": word_problem(self.split, self.seed, i).question}]}
                for i in range(count)]


_PACKAGED = {"reasoning_gym": _ReasoningGym, "chitchat": _Chitchat, "stdlib_code": _StdlibCode,
             "word_problems": _WordProblems}
EVAL_SPLIT_SOURCES = ("chitchat", "word_problems")


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


def _chitchat_conversations(split: str) -> list[tuple[str, list[dict]]]:
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


def _read_file(spec: DatasetSpec) -> list[dict]:
    path = Path(spec.name)
    if path.suffix == ".parquet":
        try:
            table = datasets.Dataset.from_parquet(str(path))
        except Exception as err:  # pyarrow raises several types for a broken file
            raise UserError(f"cannot read parquet file {path}: {err}") from err
        raw = list(table)
    else:
        raw = list(_read_json_rows(path))
    rows = []
    for number, row in enumerate(raw):
        where = f"{path} row {number + 1}"
        if not isinstance(row, dict):
            raise UserError(f"{where}: expected a JSON object, got {type(row).__name__}")
        rows.append({"id": f"{path.name}:{number}", "source": spec.text, "messages": normalize_messages(row, where)})
    if not rows:
        raise UserError(f"dataset file {path} is empty; it needs one chat per row")
    return rows


def _read_json_rows(path: Path) -> Iterable:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json" and text.lstrip().startswith("["):
        try:
            return json.loads(text)
        except json.JSONDecodeError as err:
            raise UserError(f"{path} is not valid JSON ({err}); give a JSON list of rows or JSON lines") from None
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise UserError(f"{path} line {number} is not valid JSON: {err}") from None
    return rows


def _read_hub(spec: DatasetSpec) -> list[dict]:
    try:
        table = datasets.load_dataset(spec.name, spec.config, split=spec.split)
    except Exception as err:  # network, auth, missing split: all mean "cannot read this dataset"
        raise UserError(
            f"cannot load hub dataset {spec.name!r} (config {spec.config}, split {spec.split}): "
            f"{type(err).__name__}: {err}. Offline? Save it as .jsonl/.parquet where you can reach the "
            "hub and pass the file, or use a packaged: source"
        ) from err
    return [
        {"id": f"{spec.name}:{spec.split}:{i}", "source": spec.text,
         "messages": normalize_messages(row, f"{spec.name} {spec.split} row {i + 1}")}
        for i, row in enumerate(table)
    ]


def _shares(sources: list[_Source], limit: int | None, weighted: bool) -> list[int]:
    """Rows taken from each source (see the module docstring for the rule)."""
    if not weighted:
        sizes = [s.size for s in sources]
        total = sum(sizes)
        if limit is None or limit >= total:
            return sizes
        weights = [float(size) for size in sizes]
    else:
        weights = [s.spec.weight for s in sources]
    total_weight = sum(weights)
    if limit is None:
        limit = min(math.floor(s.size * total_weight / w + 1e-9) for s, w in zip(sources, weights))
    exact = [limit * w / total_weight for w in weights]
    counts = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: (counts[i] - exact[i], i))
    for i in by_remainder[: limit - sum(counts)]:
        counts[i] += 1
    for source, count in zip(sources, counts):
        if count > source.size:
            raise UserError(
                f"{source.spec.text} has {source.size} rows but its share of the {limit}-row mixture is "
                f"{count}; lower its weight or the limit"
            )
    return counts
