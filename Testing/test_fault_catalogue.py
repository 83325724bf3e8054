"""docs/faults.md documents every fault test: each test function of ``Testing/test_faults_*.py`` by name, and
each case of their case tables (module-level dicts named ``BAD_*`` or ``*_FAULTS``) as a table row."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTING = Path(__file__).resolve().parent
CATALOGUE = TESTING.parent / "docs" / "faults.md"
FAULT_TESTS = sorted(TESTING.glob("test_faults_*.py"))


def _is_case_table(name: str) -> bool:
    return name.startswith("BAD_") or name.endswith("_FAULTS")


def fault_tests_and_cases(path: Path) -> tuple[list[str], list[str]]:
    """The test functions of a fault test file and the keys of its case tables (also those added by
    ``TABLE["case"] = ...`` after the table)."""
    tree = ast.parse(path.read_text())
    tests = [node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")]
    cases = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and _is_case_table(target.id) and isinstance(node.value, ast.Dict):
                    cases += [key.value for key in node.value.keys if isinstance(key, ast.Constant)]
                if (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name)
                        and _is_case_table(target.value.id) and isinstance(target.slice, ast.Constant)):
                    cases.append(target.slice.value)
    return tests, cases


@pytest.mark.parametrize("path", FAULT_TESTS, ids=lambda path: path.name)
def test_every_fault_test_and_case_is_in_the_catalogue(path):
    text = CATALOGUE.read_text()
    tests, cases = fault_tests_and_cases(path)
    assert f"(`{path.name}`" in text, f"docs/faults.md has no section for {path.name}"
    assert [test for test in tests if f"`{test}`" not in text] == []
    assert [case for case in cases if f"\n| {case} |" not in text] == []


def test_the_check_finds_fault_tests_and_cases():
    """The parser sees what the catalogue must list (a parser finding nothing would pass everything)."""
    tests, cases = fault_tests_and_cases(TESTING / "test_faults_training.py")
    assert "test_ctrl_c_says_whether_a_checkpoint_exists" in tests
    assert {"--patch-size 33", "--device cuda without CUDA"} <= set(cases)
    assert sum(len(fault_tests_and_cases(path)[1]) for path in FAULT_TESTS) > 100
