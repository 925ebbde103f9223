"""The book's recorded CPU runs come from the engine and the models at HEAD: a results file whose commit's engine
(`specbook.bench.ENGINE_SOURCES`) or built-in pair's weights differ from HEAD's is a table that no longer describes
the code and the models beside it."""

import ast
import json
import subprocess
from pathlib import Path

import pytest

from specbook.bench import ENGINE_SOURCES, RECORDED_BY, RESULTS

ROOT = Path(__file__).resolve().parents[1]
# Recorded by an engine older than HEAD's; the chapters that read them say so. `make results` re-records all but the
# last, chapter 7's record of another CPU, kept as it is; the last test fails for a file listed here whose engine is
# HEAD's.
PREDATES = {"vllm-amd-epyc.json"}


RECORDS = {path.name: json.loads(path.read_text()) for path in sorted(RESULTS.glob("*.json"))}
CPU_RECORDS = {name: record for name, record in RECORDS.items() if record.get("cuda") is None}  # no CUDA version


def git(*args) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)


def code(source: str) -> str:
    """A module's code without its docstrings and comments: what runs, so that a corrected sentence of prose does
    not make every table stale."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


def engine_changes(commit: str) -> list[str]:
    """The engine's sources whose code (`code`) differs between ``commit`` and HEAD."""
    changed = git("diff", "--name-only", commit, "HEAD", "--", *ENGINE_SOURCES).stdout.split()
    return [path for path in changed if not path.endswith(".py")
            or any(git("cat-file", "-e", f"{at}:{path}").returncode for at in (commit, "HEAD"))
            or code(git("show", f"{commit}:{path}").stdout) != code(git("show", f"HEAD:{path}").stdout)]


# The built-in models a file's runs read, where they are not all of its pair's: a change to another leaves it current.
READS = {"eagle3.json": ("target", "eagle", "eagle3")}


def weight_changes(commit: str, name: str, pair: str) -> list[str]:
    """The files of the models of the built-in ``pair`` that results/``name`` read (weights and configs) that differ
    between ``commit`` and HEAD."""
    specs = [f":(glob)src/specbook/assets/{pair}/{part}/{file}" for part in READS.get(name, ("**",))
             for file in ("*.safetensors", "config.json")]
    return git("diff", "--name-only", commit, "HEAD", "--", *specs).stdout.split()


def test_a_docstring_is_not_code():
    assert code('"""Prose."""\ndef f():\n    """More."""\n    return 1  # a note\n') == code("def f():\n    return 1\n")
    assert code("def f():\n    return 1\n") != code("def f():\n    return 2\n")


def test_the_cpu_records_are_known():
    assert set(CPU_RECORDS) >= PREDATES | {"eagle3.json", "vllm.json"}
    assert set(CPU_RECORDS) <= set(RECORDED_BY) | PREDATES, "a CPU results file needs its command in RECORDED_BY"


@pytest.mark.parametrize("name", sorted(set(CPU_RECORDS) - PREDATES))
def test_a_cpu_record_names_its_cpu_and_comes_from_the_engine_at_head(name):
    record = CPU_RECORDS[name]
    assert record.get("cpu"), f"results/{name} does not name its CPU"
    commit = record.get("project_commit") or ""
    assert commit and not commit.endswith("+"), \
        f"results/{name} was recorded from uncommitted code ({commit!r}): record it again from a commit"
    if git("rev-parse", "--git-dir").returncode:
        pytest.skip("not in a clone of the repository: no history to compare with")
    if git("cat-file", "-e", f"{commit}^{{commit}}").returncode:
        pytest.skip(f"commit {commit[:7]} is not in this clone's history (a shallow clone)")
    changed = engine_changes(commit) + weight_changes(commit, name, record.get("pair", "shakespeare"))
    assert not changed, (f"results/{name} was recorded at {commit[:7]}; the engine or the models have changed since "
                         f"({', '.join(changed)}): re-record it with {RECORDED_BY[name]}")


@pytest.mark.parametrize("name", sorted(PREDATES))
def test_a_file_listed_as_older_is_older(name):
    record = CPU_RECORDS[name]
    commit = record.get("project_commit") or ""
    if not commit or commit.endswith("+") or git("cat-file", "-e", f"{commit}^{{commit}}").returncode:
        return  # no commit to compare: older than the check, as listed
    assert engine_changes(commit), f"results/{name} comes from the engine at HEAD: take it off PREDATES"
