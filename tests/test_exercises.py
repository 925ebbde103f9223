"""The exercises and their checkers (specbook.exercises).

- Every checker passes the reference answer and rejects plausible wrong ones: each wrong answer
  here is a mistake a first-time reader makes (the correction drawn from q, alpha as sum max,
  tokens per step off by one, the optimal K searched from 0, ...). A checker that passed them
  would teach nothing.
- A checker never raises: an exception or a None from the learner's code is one line of output.
- Each stub notebook runs top to bottom without error, and every check in it prints a failure
  (the page the book publishes shows what a learner sees before starting); the committed
  solutions show every check passing (nbval re-runs them); stubs and solutions ask the same
  questions with the same checks.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import numpy as np
import pytest
import torch
from nbclient import NotebookClient

from specbook import exercises
from specbook.exercises import CHECKS, FAIL, PASS, Outcome
from specbook.rejection import acceptance_rate, output_distribution, residual_distribution, verify_chain
from specbook.theory import expected_tokens_per_step, optimal_k, speedup

ROOT = Path(__file__).resolve().parents[1]
STUBS = sorted((ROOT / "exercises").glob("*.ipynb"))
SOLUTIONS = [ROOT / "exercises" / "solutions" / path.name for path in STUBS]
CHECK_CELL = re.compile(r"^check_\w+\(\w+\)\s*$")


# --- References (from the package where it has one) and wrong answers ---------------------------


def _accept_prob(draft_token, target_probs, draft_probs):
    return min(1.0, float(target_probs[draft_token] / draft_probs[draft_token]))


def _reference_chain(draft_tokens, draft_probs, target_probs, uniforms, *, correction="residual",
                     leading_run=True, bonus_row=None):
    """verify_chain with given uniforms, and with switches that turn it into a wrong answer."""
    k = len(draft_tokens)
    passed = [float(uniforms[t]) < _accept_prob(int(draft_tokens[t]), target_probs[t], draft_probs[t])
              for t in range(k)]
    if leading_run:
        num_accepted = next((t for t in range(k) if not passed[t]), k)
    else:  # counts every draft that passed its test
        num_accepted = sum(passed)
    if num_accepted < k:
        t = num_accepted
        if correction == "residual":
            return num_accepted, residual_distribution(target_probs[t], draft_probs[t])
        return num_accepted, target_probs[t]
    return num_accepted, target_probs[k if bonus_row is None else bonus_row]


def _naive_residual(target_probs, draft_probs):
    excess = (target_probs - draft_probs).clamp(min=0)
    return excess / excess.sum()  # NaN when q == p


def _shortcut(target_probs, draft_probs):
    return output_distribution(target_probs, draft_probs, correction="target")


def _searched_k(start, stop_offset=1, index=False):
    def search(alpha, cost_ratio, k_max=64):
        ks = np.arange(start, k_max + stop_offset)
        with np.errstate(divide="ignore", invalid="ignore"):
            gains = (1 - alpha ** (ks + 1)) / (1 - alpha) / (cost_ratio * ks + 1)
        best = int(np.argmax(gains))
        return best if index else int(ks[best])
    return search


def _estimate_alpha(num_accepted, k):
    return num_accepted.sum() / np.minimum(num_accepted + 1, k).sum()


REFERENCES = {
    "accept_draft": lambda x, q, p, u: u < _accept_prob(x, q, p),
    "residual": residual_distribution,
    "verify_chain_by_hand": _reference_chain,
    "acceptance_rate_by_hand": acceptance_rate,
    "shortcut_output": _shortcut,
    "shortcut_bias": lambda q, p: 0.5 * (_shortcut(q, p) - q).abs().sum(),
    "tokens_per_step": expected_tokens_per_step,
    "speedup_by_hand": speedup,
    "optimal_k_by_hand": lambda alpha, c, k_max=64: optimal_k(alpha, c, k_max),
    "estimate_alpha": _estimate_alpha,
    "tokens_per_step_by_index": lambda alphas: 1 + np.cumprod(alphas).sum(),
}

WRONG = {
    "accept_draft": {
        "accept when q(x) >= p(x), ignoring the uniform": lambda x, q, p, u: bool(q[x] >= p[x]),
        "accept with probability q(x)": lambda x, q, p, u: u < float(q[x]),
        "the ratio upside down, min(1, p/q)": lambda x, q, p, u: u < min(1.0, float(p[x] / q[x])),
        "the comparison reversed": lambda x, q, p, u: u >= _accept_prob(x, q, p),
        "returns the probability, not the verdict": lambda x, q, p, u: _accept_prob(x, q, p),
    },
    "residual": {
        "not normalised": lambda q, p: (q - p).clamp(min=0),
        "letters swapped, norm((p - q)+)": lambda q, p: residual_distribution(p, q),
        "q itself": lambda q, p: q,
        "normalised |q - p|": lambda q, p: (q - p).abs() / (q - p).abs().sum(),
        "NaN when q == p": _naive_residual,
    },
    "verify_chain_by_hand": {
        "correction sampled from q instead of the residual":
            lambda *args: _reference_chain(*args, correction="target"),
        "counts every passing draft, not the leading run":
            lambda *args: _reference_chain(*args, leading_run=False),
        "bonus from q_K instead of q_{K+1}": lambda *args: _reference_chain(*args, bonus_row=-2),
        "returns a sampled token, not a distribution":
            lambda *args: (_reference_chain(*args)[0], int(_reference_chain(*args)[1].argmax())),
        "returns a triple": lambda *args: (*_reference_chain(*args), False),
    },
    "acceptance_rate_by_hand": {
        "sum of max": lambda q, p: torch.maximum(q, p).sum(-1),
        "1 - sum |p - q| (TV without the 1/2)": lambda q, p: 1 - (q - p).abs().sum(-1),
        "sum over every dimension": lambda q, p: torch.minimum(q, p).sum(),
        "mean of min(1, q/p) over the vocabulary":
            lambda q, p: torch.where(p > 0, q / p, 1.0).clamp(max=1).mean(-1),
    },
    "shortcut_output": {
        "q (the correct algorithm's output)": lambda q, p: q,
        "the accepted part only": lambda q, p: torch.minimum(q, p),
        "alpha instead of 1 - alpha": lambda q, p: torch.minimum(q, p) + acceptance_rate(q, p) * q,
    },
    "shortcut_bias": {
        "without the 1/2": lambda q, p: (_shortcut(q, p) - q).abs().sum(),
        "TV(p, q) instead of TV(shortcut, q)": lambda q, p: 1 - acceptance_rate(q, p),
        "zero": lambda q, p: 0.0,
    },
    "tokens_per_step": {
        "alpha^K instead of alpha^(K+1)": lambda a, k: (1 - a**k) / (1 - a) if a < 1 else k,
        "closed form, 0/0 at alpha = 1": lambda a, k: (1 - a ** (k + 1)) / (1 - a),
        "accepted drafts only": lambda a, k: sum(a**i for i in range(1, k + 1)),
        "the limit 1/(1 - alpha)": lambda a, k: 1 / (1 - a) if a < 1 else float("inf"),
        "linear, 1 + K alpha": lambda a, k: 1 + k * a,
    },
    "speedup_by_hand": {
        "K + 1 draft calls": lambda a, k, c: expected_tokens_per_step(a, k) / (c * (k + 1) + 1),
        "no target call in the cost": lambda a, k, c: expected_tokens_per_step(a, k) / (c * k) if c else 0.0,
        "tokens per step, not divided": lambda a, k, c: expected_tokens_per_step(a, k),
        "off-by-one tokens": lambda a, k, c: expected_tokens_per_step(a, k) - a**k,
    },
    "optimal_k_by_hand": {
        "searched from K = 0": _searched_k(0),
        "range(1, k_max), missing k_max": _searched_k(1, stop_offset=0),
        "the argmax index, not K": _searched_k(1, index=True),
        "always the largest K": lambda alpha, c, k_max=64: k_max,
    },
    "estimate_alpha": {
        "accepted / (K x steps)": lambda n, k: n.mean() / k,
        "N + 1 tested in every step": lambda n, k: n.sum() / (n + 1).sum(),
        "mean of N / (N + 1)": lambda n, k: np.mean(n / (n + 1)),
    },
    "tokens_per_step_by_index": {
        "without the 1": lambda a: np.cumprod(a).sum(),
        "1 + sum of alpha_i": lambda a: 1 + a.sum(),
        "i.i.d. formula at the mean": lambda a: expected_tokens_per_step(float(a.mean()), len(a)),
        "off by one in the products": lambda a: 1 + np.cumprod(np.r_[1.0, a[:-1]]).sum(),
    },
}


def test_every_checker_has_a_reference_and_wrong_answers():
    assert set(REFERENCES) == set(CHECKS) == set(WRONG)
    for name in CHECKS:
        assert getattr(exercises, CHECKS[name].__name__) is CHECKS[name]
        assert CHECKS[name].__name__ in exercises.__all__


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_reference_passes(name):
    outcome = CHECKS[name].outcome(REFERENCES[name])
    assert outcome == Outcome(True, outcome.message) and outcome.message.startswith(PASS), outcome.message


WRONG_CASES = [(name, label) for name in sorted(WRONG) for label in WRONG[name]]


@pytest.mark.parametrize("name, label", WRONG_CASES, ids=[f"{n}: {w}" for n, w in WRONG_CASES])
def test_wrong_answer_is_rejected(name, label):
    outcome = CHECKS[name].outcome(WRONG[name][label])
    assert not outcome.passed, f"{label!r} passed the check of {name}"
    assert outcome.message.startswith(FAIL) and "\n" not in outcome.message, outcome.message
    assert re.search(r"case \d+ of \d+", outcome.message), f"the message names no case: {outcome.message}"


def test_messages_say_what_was_expected_and_what_came_back():
    """The failure names the case, the expected value and the answer, and the likely mistake."""
    message = CHECKS["verify_chain_by_hand"].outcome(WRONG["verify_chain_by_hand"][
        "correction sampled from q instead of the residual"]).message
    assert "residual" in message and "should be [" in message and "got [" in message
    message = CHECKS["tokens_per_step"].outcome(WRONG["tokens_per_step"]["alpha^K instead of alpha^(K+1)"]).message
    assert "expected 3.3616" in message and "(1 − α^K)/(1 − α)" in message
    message = CHECKS["tokens_per_step"].outcome(WRONG["tokens_per_step"]["closed form, 0/0 at alpha = 1"]).message
    assert "ZeroDivisionError" in message and "alpha = 1.0" in message
    message = CHECKS["optimal_k_by_hand"].outcome(WRONG["optimal_k_by_hand"]["searched from K = 0"]).message
    assert "expected K = 1, got 0" in message
    message = CHECKS["residual"].outcome(WRONG["residual"]["NaN when q == p"]).message
    assert "q == p" in message and "NaN" in message


def test_verify_chain_cases_agree_with_the_package_and_cover_every_path():
    """The hidden chains are decided exactly as verify_chain decides them, and exercise a
    rejection of the first draft, a rejection later in the chain, and the bonus token."""
    paths = set()
    for case in CHECKS["verify_chain_by_hand"].cases():
        draft_tokens, draft_probs, target_probs, uniforms = case.args
        num_accepted, next_probs = _reference_chain(*case.args)
        assert num_accepted == case.expected[0]
        torch.testing.assert_close(next_probs, case.expected[1])
        k = len(draft_tokens)
        paths.add("first" if num_accepted == 0 else "bonus" if num_accepted == k else "middle")
    assert paths == {"first", "middle", "bonus"}
    # The seeded uniforms are verify_chain's own: same seed, same first K numbers.
    generator = torch.Generator().manual_seed(0)
    assert verify_chain(torch.tensor([0]), torch.tensor([[0.5, 0.5]]), torch.tensor([[0.5, 0.5]] * 2),
                        generator=generator).num_accepted == 1


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_checker_reports_exceptions_and_none_in_one_line(name, capsys):
    def not_written(*args, **kwargs):
        raise NotImplementedError

    def buggy(*args, **kwargs):
        raise IndexError("index 7 is out of bounds\nfor dimension 0 with size 5")

    def forgot_return(*args, **kwargs):
        pass

    for function, expected in ((not_written, "not written yet"), (buggy, "raised IndexError: index 7"),
                               (forgot_return, "returned None"), (42, "expected a function")):
        outcome = CHECKS[name].outcome(function)
        assert not outcome.passed and outcome.message.startswith(FAIL), outcome.message
        assert expected in outcome.message and "\n" not in outcome.message, outcome.message
        assert "Traceback" not in outcome.message
    assert CHECKS[name](not_written) is None
    printed = capsys.readouterr().out
    assert printed.count("\n") == 1 and printed.startswith(FAIL)


def test_checker_cases_cannot_be_changed_by_the_learner():
    def vandal(target_probs, draft_probs):
        target_probs.zero_()
        return torch.minimum(target_probs, draft_probs).sum(-1)

    CHECKS["acceptance_rate_by_hand"].outcome(vandal)
    assert CHECKS["acceptance_rate_by_hand"].outcome(REFERENCES["acceptance_rate_by_hand"]).passed


# --- Notebooks -----------------------------------------------------------------------------------


def check_cells(notebook) -> list:
    return [cell for cell in notebook.cells if cell.cell_type == "code" and CHECK_CELL.match(cell.source)]


def printed(cell) -> str:
    return "".join(output.get("text", "") for output in cell.get("outputs", [])
                   if output.output_type == "stream")


def test_every_stub_has_its_solution():
    assert len(STUBS) >= 2, STUBS
    missing = [path.relative_to(ROOT).as_posix() for path in SOLUTIONS if not path.exists()]
    assert not missing, f"exercise notebooks without solutions: {missing}"


@pytest.mark.parametrize("stub, solution", list(zip(STUBS, SOLUTIONS)), ids=[p.name for p in STUBS])
def test_stub_and_solution_ask_the_same_questions(stub, solution):
    stub_nb, solution_nb = nbformat.read(stub, as_version=4), nbformat.read(solution, as_version=4)

    def exercises_of(notebook):
        return [cell.source for cell in notebook.cells if cell.cell_type == "markdown"
                and cell.source.startswith("## Exercise")]

    assert exercises_of(stub_nb) == exercises_of(solution_nb)
    assert 4 <= len(exercises_of(stub_nb)) <= 8
    assert [c.source for c in check_cells(stub_nb)] == [c.source for c in check_cells(solution_nb)]
    assert all("TODO" in cell.source for cell in stub_nb.cells if cell.cell_type == "code"
               and "NotImplementedError" in cell.source)


@pytest.mark.parametrize("solution", SOLUTIONS, ids=[p.name for p in SOLUTIONS])
def test_committed_solutions_pass_every_check(solution):
    cells = check_cells(nbformat.read(solution, as_version=4))
    assert cells
    failing = [(cell.source, printed(cell)) for cell in cells if not printed(cell).startswith(PASS)]
    assert not failing, failing


@pytest.mark.parametrize("stub", STUBS, ids=[p.name for p in STUBS])
def test_stub_runs_top_to_bottom_and_every_check_fails_helpfully(stub, tmp_path):
    notebook = nbformat.read(stub, as_version=4)
    NotebookClient(notebook, timeout=120, kernel_name="python3", record_timing=False,
                   resources={"metadata": {"path": str(stub.parent)}}).execute()
    errors = [cell.source for cell in notebook.cells if cell.cell_type == "code"
              and any(output.output_type == "error" for output in cell.outputs)]
    assert not errors, f"cells raised: {errors}"
    cells = check_cells(notebook)
    assert len(cells) >= 4
    for cell in cells:
        lines = printed(cell).splitlines()
        assert len(lines) == 1 and lines[0].startswith(FAIL), (cell.source, printed(cell))
        assert "not written yet" in lines[0], lines[0]
