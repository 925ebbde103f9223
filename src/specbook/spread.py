"""The spread of a benchmark's rounds, and ranking within it.

`specbook.bench.run_benchmark` runs every method once per round, in the same rounds, so round r gives each
method a time measured with the machine in the same state. `speedup_range` turns the rounds into the range of
a speedup, `fastest` names the best row together with the rows its range cannot tell it from, `compared`
says whether one row is faster than another beyond both ranges, and `spread_text`, `spread_of`, `tie_text`
and `show_spreads` print them: "1.82x (1.75-1.90)".
"""


def speedup_range(baseline_rounds, method_rounds, speedup) -> tuple[float, float]:
    """The spread of a speedup: the lowest and highest of the per-round speedups, the baseline's time in
    round r over the method's in the same round r (both measured in that round, by the same machine in the
    same state), widened to hold ``speedup``, the ratio of the medians: taken prompt by prompt (or over an
    even number of rounds), a median need not lie between the rounds' extremes."""
    if len(baseline_rounds) != len(method_rounds) or not method_rounds:
        raise ValueError(f"baseline_rounds and method_rounds must be the same, non-zero number of rounds (got "
                         f"{len(baseline_rounds)} and {len(method_rounds)})")
    ratios = [baseline / seconds for baseline, seconds in zip(baseline_rounds, method_rounds)] + [speedup]
    return min(ratios), max(ratios)


def fastest(rows, key="speedup", repeats=2) -> tuple[dict, list[dict], bool]:
    """The row of ``rows`` with the highest ``key`` (a speedup, with its range ``key_min``..``key_max``), the
    other rows tied with it, and whether it is distinguishable from them.

    A row is tied with the fastest when their ranges overlap (its ``key_max`` reaches the fastest's
    ``key_min``): in this run either could be the faster. The fastest is distinguishable when no row is tied
    with it and there was more than one round (``repeats``): one round measures no spread at all. A row
    without the range (a results file older than the columns) counts as its ``key`` alone."""
    best = max(rows, key=lambda row: row[key])
    low = _range(best, key)[0]
    tied = [row for row in rows if row is not best and _range(row, key)[1] >= low]
    return best, tied, not tied and repeats > 1


def compared(row, other, key="speedup") -> str:
    """"faster than" or "slower than" where the range of ``row[key]`` lies wholly above or below that of
    ``other[key]`` (``key_min``..``key_max``, as in `fastest`), else "within the spread of": the run cannot
    rank the two."""
    (low, high), (other_low, other_high) = _range(row, key), _range(other, key)
    if low > other_high:
        return "faster than"
    if high < other_low:
        return "slower than"
    return "within the spread of"


def _range(row, key) -> tuple[float, float]:
    """``row[key]``'s range over the rounds, ``key_min``..``key_max``; a row without it (a results file older than
    the columns) is its ``key`` alone."""
    return row.get(f"{key}_min", row[key]), row.get(f"{key}_max", row[key])


def spread_text(value, low=None, high=None, unit="x", digits=2) -> str:
    """A median with the range of its rounds, for tables: '1.82x (1.75-1.90)'; just '1.82x' without a range."""
    text = f"{value:.{digits}f}{unit}"
    if low is None or high is None or low != low or high != high:  # none, or NaN in a table
        return text
    return f"{text} ({low:.{digits}f}-{high:.{digits}f})"


def spread_of(row, key, unit="x", digits=2) -> str:
    """`spread_text` of ``row[key]`` with ``row[key_min]`` and ``row[key_max]``, where the row has them."""
    return spread_text(row[key], row.get(f"{key}_min"), row.get(f"{key}_max"), unit, digits)


def tie_text(tied, distinguishable) -> str:
    """How the fastest row stands, in words, from `fastest`'s answer (``tied``: the names of the rows tied)."""
    if tied:
        return f"tied within the spread with {', '.join(map(str, tied))}"
    return "ahead of the rest beyond the spread" if distinguishable else "one round: no spread to rank by"


def show_spreads(table, columns, unit="x", digits=2):
    """A copy of the data frame ``table`` for printing, each column c of ``columns`` as `spread_of` c (its
    c_min and c_max dropped)."""
    shown = table.copy()
    for column in columns:
        shown[column] = [spread_of(row, column, unit, digits) for row in table.to_dict("records")]
    return shown.drop(columns=[f"{c}_{end}" for c in columns for end in ("min", "max") if f"{c}_{end}" in shown])
