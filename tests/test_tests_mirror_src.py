"""tests/ mirrors src/eaglewire/: a folder per package (tests/doctor/ tests eaglewire.doctor), test files at the
top only for the top-level modules and the project as a whole, basenames unique (conftest.py puts every folder on
sys.path, so test files import each other's fixtures by basename), and no folder hidden from git by a global
gitignore (`target/`). scripts/mirror_tests.py places flat files; a new one lands in its package's folder."""

from __future__ import annotations

import subprocess
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
PACKAGE = ROOT / "src" / "eaglewire"
# folders of tests/ that are no package's: benchmark code's tests, fixture files, scripts run in client venvs
OTHER_FOLDERS = {"benchmarks", "clients"}
# top-level test files: a top-level module's (contract.py, cache.py, api.py as the front door, ...) or the
# whole project's (docs, README, import order, types, every reader's damaged files, ...)
ROOT_TESTS = {
    "test_cache_integrity.py",
    "test_contract.py",
    "test_damaged_files.py",
    "test_dflash_engine_rules.py",
    "test_one_loader.py",
    "test_evaluate_draft.py",
    "test_mutated_exports.py",
    "test_size_bounds.py",
    "test_code_size.py",
    "test_docs.py",
    "test_front_door.py",
    "test_import_graph.py",
    "test_mutated_files.py",
    "test_no_data_loss.py",
    "test_no_history.py",
    "test_outputs.py",
    "test_paths.py",
    "test_readme.py",
    "test_tests_mirror_src.py",
    "test_toy_family.py",
    "test_types.py",
    "test_lint.py",
    "test_one_off_by_one.py",
}


def _packages() -> set[str]:
    return {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}


def test_every_src_package_has_its_test_folder():
    missing = sorted(p for p in _packages() if not any((TESTS / p).glob("test_*.py")))
    assert not missing, f"src packages with no tests/<package>/test_*.py: {missing}"


def test_every_test_folder_names_a_package():
    folders = {d.name for d in TESTS.iterdir() if d.is_dir() and any(d.glob("test_*.py"))}
    stray = sorted(folders - _packages() - OTHER_FOLDERS)
    assert not stray, f"tests/ folders that mirror no src package: {stray}"


def test_only_top_level_and_project_tests_stay_at_the_top():
    flat = sorted(p.name for p in TESTS.glob("test_*.py") if p.name not in ROOT_TESTS)
    assert not flat, f"place these in their package's folder (scripts/mirror_tests.py: MOVES): {flat}"


def test_test_basenames_are_unique():
    stems = [p.stem for p in TESTS.rglob("test_*.py")]
    assert len(stems) == len(set(stems)), sorted({s for s in stems if stems.count(s) > 1})


def test_no_test_folder_is_hidden_by_a_global_target_ignore(tmp_path):
    excludes = tmp_path / "global-gitignore"
    excludes.write_text("target/\n")
    hidden = [
        d.name
        for d in sorted(TESTS.iterdir())
        if any(d.glob("test_*.py"))
        and subprocess.run(
            ["git", "-c", f"core.excludesFile={excludes}", "check-ignore", "-q", f"tests/{d.name}/test_x.py"],
            cwd=ROOT,
            capture_output=True,
        ).returncode
        == 0
    ]
    assert not hidden, f"tests/ folders a global `target/` entry hides from git: {hidden}"
