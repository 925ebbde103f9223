"""The token trace: every token a speculative generation touched, coloured by what happened to it."""




TRACE_COLOURS = {  # role -> (HTML background, ANSI colour code)
    "accepted": ("#c8e6c9", "32"),  # a draft the target kept
    "rejected": ("#ffcdd2", "31"),  # the first draft the target refused (shown struck through)
    "corrected": ("#ffe0b2", "33"),  # drawn from the residual in its place
    "bonus": ("#bbdefb", "34"),  # the free extra token after K accepted drafts
    "target": ("#eeeeee", "0"),  # a step with nothing drafted: a plain target token
}


def trace_roles(generation):
    """Every token a speculative generation touched, in order, as (token id, role) pairs.

    Drafts after a rejected one were never verified and are left out; so is anything past the
    generation's end (max_new_tokens or the end-of-sequence token).
    """
    roles = []
    for step in generation.steps:
        roles += [(token, "accepted") for token in step.drafted[: step.accepted]]
        if step.accepted < len(step.drafted):
            roles.append((step.drafted[step.accepted], "rejected"))
            roles.append((step.next_token, "corrected"))
        else:
            roles.append((step.next_token, "bonus" if step.drafted else "target"))
    kept, emitted = [], 0
    for token, role in roles:
        if emitted == len(generation.token_ids):
            break
        kept.append((token, role))
        emitted += role != "rejected"
    return kept


class TokenTrace:
    """A coloured trace of a generation: shows as HTML in a notebook, as ANSI colours in a terminal."""

    def __init__(self, generation, tokenizer):
        self.pieces = [(tokenizer.decode([token]), role) for token, role in trace_roles(generation)]

    def _repr_html_(self):
        import html

        spans = []
        for text, role in self.pieces:
            style = f"background:{TRACE_COLOURS[role][0]};" + ("text-decoration:line-through;" if role == "rejected" else "")
            shown = html.escape(text).replace("\n", "↵<br>")
            spans.append(f'<span class="specbook-{role}" title="{role}" style="{style}">{shown}</span>')
        legend = " ".join(f'<span style="background:{colour};padding:0 4px">{role}</span>'
                          for role, (colour, _) in TRACE_COLOURS.items() if role != "target")
        return (f'<div class="specbook-trace" style="font-family:monospace;white-space:pre-wrap;line-height:1.6">'
                f'{"".join(spans)}</div><div style="font-size:smaller">{legend}</div>')

    def ansi(self) -> str:
        codes = {role: ansi for role, (_, ansi) in TRACE_COLOURS.items()}
        return "".join(f"\033[{codes[role]}{';9' if role == 'rejected' else ''}m{text}\033[0m"
                       for text, role in self.pieces)

    def __str__(self):
        return "".join(f"[{text}]" if role == "rejected" else text for text, role in self.pieces)


def render_trace(generation, tokenizer, style="html"):
    """The token trace of a speculative generation: ``style="html"`` for notebooks, ``"ansi"`` for terminals."""
    if style not in ("html", "ansi"):
        raise ValueError(f"style must be 'html' or 'ansi' (got {style!r})")
    trace = TokenTrace(generation, tokenizer)
    return trace if style == "html" else trace.ansi()
