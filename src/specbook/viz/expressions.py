"""Vega expressions: the formulas the live charts evaluate in the browser, written once here.

Arguments are Vega expression strings (a parameter name, a `datum.field`, or a number). The tests
evaluate these strings and compare them with `specbook.theory` and `specbook.rejection`.
"""




def tokens_per_step_expression(alpha: str, k: str) -> str:
    """Vega expression for expected tokens per target call, (1 - alpha^(K+1)) / (1 - alpha).

    Equals `specbook.theory.expected_tokens_per_step`; at alpha = 1 the closed form is 0/0 and
    the expression returns the limit K + 1, as theory does.
    """
    return f"if(({alpha}) == 1, ({k}) + 1, (1 - pow({alpha}, ({k}) + 1)) / (1 - ({alpha})))"


def speedup_expression(alpha: str, k: str, cost_ratio: str) -> str:
    """Vega expression for the wall-time speedup E / (c K + 1), as `specbook.theory.speedup`."""
    return f"({tokens_per_step_expression(alpha, k)}) / (({cost_ratio}) * ({k}) + 1)"


def mix_expression(draft: str, target: str, weight: str) -> str:
    """Vega expression for the mixed draft p_lambda = (1 - lambda) p + lambda q at one token."""
    return f"(1 - ({weight})) * ({draft}) + ({weight}) * ({target})"


def accepted_expression(draft: str, target: str) -> str:
    """Vega expression for min(p, q) at one token: area 1, the mass accepted straight away."""
    return f"min({draft}, {target})"


def residual_expression(draft: str, target: str) -> str:
    """Vega expression for (q - p)+ at one token: area 2, the mass the residual fills."""
    return f"max(({target}) - ({draft}), 0)"


def rejected_expression(draft: str, target: str) -> str:
    """Vega expression for (p - q)+ at one token: the draft mass that gets rejected."""
    return f"max(({draft}) - ({target}), 0)"
