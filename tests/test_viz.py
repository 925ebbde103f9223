"""Tests for specbook.viz: the figures show what the text says they show.

- The area plot shades exactly min(p, q) (total alpha) and (q - p)+ (total 1 - alpha), read
  back from the returned figure's patches.
- The live Altair charts bind their sliders to Vega-Lite parameters, and their Vega expressions
  compute what specbook.theory and specbook.rejection compute. The expressions are checked twice:
  translated to Python (a small, strict translator that refuses any syntax it does not know),
  and evaluated by Vega itself through vl_convert (skipped when vl_convert is missing).
"""

import math
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from specbook import theory, viz
from specbook.rejection import acceptance_rate

TOKENS = ["mat", "floor", "sofa", "roof", "moon"]
TARGET = torch.tensor([0.45, 0.25, 0.15, 0.10, 0.05], dtype=torch.float64)
DRAFT = torch.tensor([0.60, 0.10, 0.10, 0.05, 0.15], dtype=torch.float64)

ALPHAS = [i / 100 for i in range(101)]  # the slider's own grid, 1 included
KS = list(range(1, 17))
COST_RATIOS = [0.0, 0.01, 0.05, 0.1, 0.37, 1.0]


# --- a strict Vega-expression -> Python translator ------------------------------------------

_VEGA_FUNCTIONS = {
    "if": lambda test, then, otherwise: then if test else otherwise,
    "pow": lambda base, exponent: float(base) ** float(exponent),
    "min": min,
    "max": max,
}
_ALLOWED = re.compile(r"\s+|\d+(\.\d+)?|datum\.[A-Za-z_]\w*|[A-Za-z_]\w*|==|[-+*/(),]")


def evaluate_vega(expression: str, datum: dict | None = None, **params) -> float:
    """Evaluate a Vega expression in Python, refusing any token this translation does not cover.

    Covered: numbers, `datum.field`, parameter names, + - * / ==, parentheses and the functions
    if(test, a, b), pow, min, max, which mean the same in Vega and here. Both branches of if()
    are evaluated eagerly, so an untaken branch may divide by zero: that branch yields NaN.
    """
    position = 0
    names = set()
    while position < len(expression):
        match = _ALLOWED.match(expression, position)
        assert match, f"untranslated Vega syntax at {expression[position:]!r}"
        token = match.group()
        if re.fullmatch(r"[A-Za-z_]\w*", token):
            names.add(token)
        position = match.end()
    unknown = names - set(_VEGA_FUNCTIONS) - set(params) - {"datum"}
    assert not unknown, f"unknown names in Vega expression: {unknown}"
    python = re.sub(r"\bif\(", "if_(", expression)
    env = {**{("if_" if k == "if" else k): f for k, f in _VEGA_FUNCTIONS.items()},
           "datum": SimpleNamespace(**(datum or {})),
           **{name: np.float64(value) for name, value in params.items()}}
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(eval(python, {"__builtins__": {}}, env))  # noqa: S307 (checked above)


def test_translator_refuses_unknown_syntax():
    with pytest.raises(AssertionError, match="untranslated"):
        evaluate_vega("alpha > 0 ? 1 : 2", alpha=0.5)
    with pytest.raises(AssertionError, match="unknown names"):
        evaluate_vega("exp(alpha)", alpha=0.5)


# --- the Vega expressions agree with specbook.theory -------------------------------------------

def test_tokens_per_step_expression_matches_theory():
    expression = viz.tokens_per_step_expression("alpha", "datum.K")
    for alpha in ALPHAS:
        for k in KS:
            got = evaluate_vega(expression, {"K": k}, alpha=alpha)
            assert got == pytest.approx(theory.expected_tokens_per_step(alpha, k), rel=1e-12)


def test_speedup_expression_matches_theory():
    expression = viz.speedup_expression("alpha", "datum.K", "cost_ratio")
    for alpha in ALPHAS:
        for k in KS:
            for cost_ratio in COST_RATIOS:
                got = evaluate_vega(expression, {"K": k}, alpha=alpha, cost_ratio=cost_ratio)
                assert got == pytest.approx(theory.speedup(alpha, k, cost_ratio), rel=1e-12)


def test_best_k_from_expression_matches_optimal_k():
    """The chart's best K (argmax, smallest on ties) is theory's, up to float-level ties.

    The closed form and theory's sum round differently in the last bit, so where two K give the
    same speedup to 1e-12 (c = 0 with small alpha: alpha^(K+1) falls below the float epsilon)
    either may win; there the two best speedups must agree instead.
    """
    expression = viz.speedup_expression("alpha", "datum.K", "cost_ratio")
    for alpha in ALPHAS[1:-1]:
        for cost_ratio in COST_RATIOS:
            gains = [evaluate_vega(expression, {"K": k}, alpha=alpha, cost_ratio=cost_ratio)
                     for k in KS]
            chart_best = KS[int(np.argmax(gains))]
            theory_best = theory.optimal_k(alpha, cost_ratio, k_max=16)
            if chart_best != theory_best:
                assert gains[chart_best - 1] == pytest.approx(
                    theory.speedup(alpha, theory_best, cost_ratio), rel=1e-12)
                assert cost_ratio == 0  # the only place float ties occur on the slider grid


def test_area_expressions_match_rejection_math():
    for weight in [0.0, 0.13, 0.5, 0.99, 1.0]:
        mixed = (1 - weight) * DRAFT + weight * TARGET
        pieces = {"mixed": [], "accepted": [], "residual": [], "rejected": []}
        for draft, target in zip(DRAFT.tolist(), TARGET.tolist()):
            datum = {"draft": draft, "target": target}
            value = evaluate_vega(viz.mix_expression("datum.draft", "datum.target", "mix_weight"),
                                  datum, mix_weight=weight)
            datum["mixed"] = value
            pieces["mixed"].append(value)
            for name in ("accepted", "residual", "rejected"):
                build = getattr(viz, f"{name}_expression")
                pieces[name].append(evaluate_vega(build("datum.mixed", "datum.target"), datum))
        np.testing.assert_allclose(pieces["mixed"], mixed, rtol=0, atol=1e-15)
        np.testing.assert_allclose(pieces["accepted"], torch.minimum(mixed, TARGET), atol=1e-15)
        np.testing.assert_allclose(pieces["residual"], (TARGET - mixed).clamp(min=0), atol=1e-15)
        alpha = float(acceptance_rate(TARGET, mixed))
        assert sum(pieces["accepted"]) == pytest.approx(alpha, abs=1e-12)
        assert sum(pieces["residual"]) == pytest.approx(1 - alpha, abs=1e-12)
        assert sum(pieces["rejected"]) == pytest.approx(1 - alpha, abs=1e-12)


# --- the charts use those expressions and bind their sliders ----------------------------------

def _transforms(spec) -> list[dict]:
    """Every transform anywhere in a Vega-Lite spec."""
    found = []
    if isinstance(spec, dict):
        found.extend(spec.get("transform", []))
        for value in spec.values():
            found.extend(_transforms(value))
    elif isinstance(spec, list):
        for value in spec:
            found.extend(_transforms(value))
    return found


def _calculations(spec) -> dict[str, set[str]]:
    """Field name -> the set of Vega expressions that compute it in the spec."""
    calculations = {}
    for transform in _transforms(spec):
        if "calculate" in transform:
            calculations.setdefault(transform["as"], set()).add(transform["calculate"])
    return calculations


def _params(spec) -> dict[str, dict]:
    return {param["name"]: param for param in spec.get("params", [])}


def test_speedup_chart_binds_sliders():
    spec = viz.speedup_chart(alpha=0.7, cost_ratio=0.05, k=3, k_max=12).to_dict()
    params = _params(spec)
    assert set(params) == {"alpha", "cost_ratio", "k"}
    for name, value, low, high, step in [("alpha", 0.7, 0, 1, 0.01),
                                         ("cost_ratio", 0.05, 0, 1, 0.01), ("k", 3, 1, 12, 1)]:
        assert params[name]["value"] == value
        bind = params[name]["bind"]
        assert (bind["input"], bind["min"], bind["max"], bind["step"]) == ("range", low, high, step)


def test_speedup_chart_computes_with_the_tested_expressions():
    calculations = _calculations(viz.speedup_chart().to_dict())
    assert calculations["tokens"] == {viz.tokens_per_step_expression("alpha", "datum.K")}
    assert calculations["speedup"] == {viz.speedup_expression("alpha", "datum.K", "cost_ratio")}


def test_area_chart_binds_slider_and_uses_tested_expressions():
    spec = viz.area_chart(TARGET, DRAFT, TOKENS, weight=0.25).to_dict()
    params = _params(spec)
    assert set(params) == {"mix_weight"}
    assert params["mix_weight"]["value"] == 0.25
    assert params["mix_weight"]["bind"]["input"] == "range"
    calculations = _calculations(spec)
    assert calculations["mixed"] == {viz.mix_expression("datum.draft", "datum.target", "mix_weight")}
    assert calculations["accepted"] == {viz.accepted_expression("datum.mixed", "datum.target")}
    assert calculations["residual"] == {viz.residual_expression("datum.mixed", "datum.target")}
    assert calculations["rejected"] == {viz.rejected_expression("datum.mixed", "datum.target")}


def test_charts_reject_bad_arguments():
    with pytest.raises(ValueError, match="alpha"):
        viz.speedup_chart(alpha=1.5)
    with pytest.raises(ValueError, match="k must"):
        viz.speedup_chart(k=20, k_max=16)
    with pytest.raises(ValueError, match="weight"):
        viz.area_chart(TARGET, DRAFT, weight=-0.1)
    with pytest.raises(ValueError, match="draft_probs"):
        viz.area_chart(TARGET, DRAFT * 2)


# --- Vega itself evaluates the charts (through vl_convert, offline) ---------------------------

def _texts(node) -> list[str]:
    """All text items in a Vega scenegraph."""
    if isinstance(node, dict):
        found = [node["text"]] if isinstance(node.get("text"), str) else []
        return found + [text for value in node.values() for text in _texts(value)]
    if isinstance(node, list):
        return [text for value in node for text in _texts(value)]
    return []


def _render_texts(spec: dict) -> list[str]:
    vl_convert = pytest.importorskip("vl_convert")
    return _texts(vl_convert.vegalite_to_scenegraph(spec))


def test_vega_evaluates_the_expressions_like_theory():
    import altair as alt

    rows = [{"id": i, "alpha": alpha, "K": k, "c": c}
            for i, (alpha, k, c) in enumerate((alpha, k, c) for alpha in [0, 0.01, 0.37, 0.5, 0.99, 1]
                                             for k in [1, 2, 7, 16] for c in [0, 0.05, 1])]
    chart = alt.Chart(alt.Data(values=rows)).transform_calculate(
        tokens=viz.tokens_per_step_expression("datum.alpha", "datum.K"),
        speedup=viz.speedup_expression("datum.alpha", "datum.K", "datum.c"),
    ).transform_calculate(
        label="datum.id + ' ' + datum.tokens + ' ' + datum.speedup",  # JS number -> shortest repr
    ).mark_text().encode(text="label:N", y="id:O")
    texts = [t for t in _render_texts(chart.to_dict()) if t.count(" ") == 2]
    assert len(texts) == len(rows)
    for text in texts:
        index, tokens, gain = text.split(" ")
        row = rows[int(index)]
        assert float(tokens) == pytest.approx(
            theory.expected_tokens_per_step(row["alpha"], row["K"]), rel=1e-12)
        assert float(gain) == pytest.approx(theory.speedup(row["alpha"], row["K"], row["c"]), rel=1e-12)


@pytest.mark.parametrize("alpha, cost_ratio, k", [(0.8, 0.1, 4), (0.55, 0.02, 2), (1.0, 0.0, 16),
                                                  (0.3, 0.5, 1)])
def test_speedup_chart_renders_theory_values(alpha, cost_ratio, k):
    texts = _render_texts(viz.speedup_chart(alpha, cost_ratio, k, k_max=16).to_dict())
    tokens = theory.expected_tokens_per_step(alpha, k)
    gain = theory.speedup(alpha, k, cost_ratio)
    assert f"K = {k}:  {tokens:.2f} tokens per call,  {gain:.2f}× speedup" in texts
    assert f"best K = {theory.optimal_k(alpha, cost_ratio, k_max=16)}" in texts


def test_area_chart_renders_alpha():
    for weight in (0.0, 0.6):
        mixed = (1 - weight) * DRAFT + weight * TARGET
        alpha = float(acceptance_rate(TARGET, mixed))
        texts = _render_texts(viz.area_chart(TARGET, DRAFT, TOKENS, weight=weight).to_dict())
        assert f"α = Σ min(p_λ, q) = {alpha:.3f},   1 − α = {1 - alpha:.3f}" in texts


# --- the matplotlib figures draw the numbers they claim --------------------------------------

def _patch_heights(fig, gid: str) -> np.ndarray:
    return np.array([patch.get_height() for patch in fig.axes[0].patches if patch.get_gid() == gid])


def _random_pairs(count: int = 20):
    rng = np.random.default_rng(1)
    for _ in range(count):
        vocab = int(rng.integers(2, 12))
        pair = []
        for _ in range(2):
            probs = rng.dirichlet(np.full(vocab, 0.7))
            probs[rng.random(vocab) < 0.3] = 0
            if probs.sum() == 0:
                probs[0] = 1
            pair.append(torch.tensor(probs / probs.sum()))
        yield pair


def test_area_plot_shades_min_and_positive_part():
    for target, draft in [(TARGET, DRAFT), *_random_pairs()]:
        fig = viz.area_plot(target, draft)
        accepted, residual, rejected = (_patch_heights(fig, gid)
                                        for gid in ("accepted", "residual", "rejected"))
        widths = {patch.get_width() for patch in fig.axes[0].patches}
        assert widths == {1.0}  # so a patch's area is its height
        np.testing.assert_allclose(accepted, torch.minimum(target, draft), atol=1e-12)
        np.testing.assert_allclose(residual, (target - draft).clamp(min=0), atol=1e-12)
        np.testing.assert_allclose(rejected, (draft - target).clamp(min=0), atol=1e-12)
        np.testing.assert_allclose(accepted + residual, target, atol=1e-12)  # area 1 + 2 = q
        alpha = float(acceptance_rate(target, draft))
        assert accepted.sum() == pytest.approx(alpha, abs=1e-12)
        assert residual.sum() == pytest.approx(1 - alpha, abs=1e-12)
        assert f"{alpha:.3f}" in fig.axes[0].get_title()


def test_area_plot_stacks_residual_on_accepted():
    fig = viz.area_plot(TARGET, DRAFT, TOKENS)
    patches = {gid: [p for p in fig.axes[0].patches if p.get_gid() == gid]
               for gid in ("accepted", "residual")}
    for below, above in zip(patches["accepted"], patches["residual"]):
        assert above.get_y() == pytest.approx(below.get_height())
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == TOKENS


def test_area_plot_names_bad_arguments():
    with pytest.raises(ValueError, match="target_probs"):
        viz.area_plot(TARGET * 2, DRAFT)
    with pytest.raises(ValueError, match="same shape"):
        viz.area_plot(TARGET, torch.tensor([0.5, 0.5], dtype=torch.float64))
    with pytest.raises(ValueError, match="tokens"):
        viz.area_plot(TARGET, DRAFT, ["a", "b"])


def test_speedup_plot_draws_theory():
    fig = viz.speedup_plot([0.6, 0.9], 0.05, k_max=10, k=3)
    tokens_ax, speedup_ax = fig.axes
    ks = np.arange(1, 11)
    for alpha in (0.6, 0.9):
        (tokens_line,) = [line for line in tokens_ax.lines if line.get_gid() == f"tokens α={alpha:g}"]
        (speedup_line,) = [line for line in speedup_ax.lines if line.get_gid() == f"speedup α={alpha:g}"]
        np.testing.assert_allclose(tokens_line.get_xdata(), ks)
        np.testing.assert_allclose(tokens_line.get_ydata(), theory.expected_tokens_per_step(alpha, ks))
        np.testing.assert_allclose(speedup_line.get_ydata(), theory.speedup(alpha, ks, 0.05))
        best = theory.optimal_k(alpha, 0.05, k_max=10)
        stars = [line for line in speedup_ax.lines if line.get_marker() == "*"
                 and line.get_color() == speedup_line.get_color()]
        assert [tuple(star.get_xydata()[0]) for star in stars] == [
            pytest.approx((best, theory.speedup(alpha, best, 0.05)))]


def test_optimal_k_plot_draws_optimal_k():
    alphas = np.array([0.05, 0.3, 0.6, 0.9])
    fig = viz.optimal_k_plot([0.1], alphas=alphas)
    (line,) = [line for line in fig.axes[0].lines if line.get_gid() == "c=0.1"]
    expected = [theory.optimal_k(a, 0.1) for a in alphas]
    useful = theory.speedup(alphas, np.array(expected), 0.1) > 1
    np.testing.assert_allclose(line.get_ydata()[useful], np.array(expected)[useful])
    assert np.isnan(line.get_ydata()[~useful]).all()  # alpha <= c: drawn faint, not here


def test_distributions_plot_draws_each_series():
    fig = viz.distributions_plot({"q": TARGET, "p": DRAFT}, TOKENS)
    for name, values in (("q", TARGET), ("p", DRAFT)):
        np.testing.assert_allclose(_patch_heights(fig, name), values)
    assert math.isclose(sum(_patch_heights(fig, "q")), 1.0)


# --- the token trace

def test_trace_emits_exactly_the_generated_tokens():
    from support import tiny_model
    from specbook import Sampler, speculative_generate
    from specbook.viz import trace_roles

    target, draft = tiny_model(seed=0), tiny_model(hidden_size=16, num_layers=1, seed=1)
    prompt = torch.tensor([[1, 2, 3]])
    for drafter, k in ((draft, 3), (target, 8)):
        generation = speculative_generate(target, drafter, prompt, 23, k=k, sampler=Sampler(0))
        roles = trace_roles(generation)
        assert [token for token, role in roles if role != "rejected"] == generation.token_ids
        rejected = [i for i, (_, role) in enumerate(roles) if role == "rejected"]
        assert all(roles[i + 1][1] == "corrected" for i in rejected)  # a correction follows every rejection
    assert {role for _, role in roles} <= {"accepted", "bonus"}  # the target as its own draft: nothing rejected


def test_trace_renders_html_and_ansi():
    from specbook.decoding import Generation, Stats, Step
    from specbook.viz import render_trace

    class Letters:  # a stand-in tokenizer: token i is the i-th letter
        def decode(self, ids):
            return "".join(chr(ord("a") + i) for i in ids)

    generation = Generation([0, 1, 2, 3], Stats(2, 3, 0.5, 2.0, 0.0),
                            [Step([0, 4], 1, 1, False), Step([2], 1, 3, True)])
    html = render_trace(generation, Letters())._repr_html_()
    assert html.count('<span class="specbook-') == 5 and "line-through" in html
    assert render_trace(generation, Letters(), style="ansi").count("\033[0m") == 5
    assert str(render_trace(generation, Letters())) == "a[e]bcd"
    with pytest.raises(ValueError, match="style"):
        render_trace(generation, Letters(), style="latex")


def test_glue_hands_python_numbers_to_myst_nb(monkeypatch):
    """The book's prose formats glued values ({glue:text}`name:.2f`): a NumPy scalar must arrive as a float."""
    myst_nb = pytest.importorskip("myst_nb")  # the book's builder: not a dependency of the package itself

    from specbook.glue import glue

    recorded = []
    monkeypatch.setattr(myst_nb, "glue", lambda name, value, display: recorded.append((name, value, display)))
    glue("c", np.float64(0.069))
    glue("k", 5)
    assert recorded == [("c", 0.069, False), ("k", 5, False)] and type(recorded[0][1]) is float
