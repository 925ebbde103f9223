"""Benchmarks of batched decoding (chapter 7): what a verification costs as the batch grows, and where
speculation stops paying.

`call_costs` times the calls the batched engine makes: one call of a model on n new positions per row,
after a context, at each batch size (over the cache `specbook.ragged.rows_cache` gives the model, as
`specbook.batch` calls it: the package's decoder with a write offset per row, where it serves the model).
Their ratios are chapter 3's costs at batch size B: the draft's cost ratio c_B (a draft call over a
target call on one position) and the verification ratio v_B(K + 1) (a target call on K + 1 positions
over one on one), which `specbook.theory.batch_speedup` turns into a predicted speedup and
`specbook.policies.BatchSizeK.from_costs` into a draft length per batch size.

`batch_suite` then times, at each batch size, on the same left-padded prompts: batched autoregressive
decoding, the same prompts decoded one at a time (what batching gains), Hugging Face's batched
``generate``, batched speculative decoding at each K and with the batch-size policy of the formula (and, at
batch size one, the batch-of-one loop, and the batched engine's own loop on one row, which a batch of one
skips). Rounds are interleaved, a method's time is its median, and every ratio is taken within the run, with
the spread of the rounds beside it; the fastest method at each batch size is named with those its spread cannot
tell it from. Hugging Face's assisted generation refuses batches larger than one; the suite asks it and records
its answer. Last, the policy of the measurement (`BatchSizeK.from_speedups`: each batch size's fastest K where
it beat autoregressive decoding in every round, else none) is timed at each batch size beside autoregressive
decoding again.

At batch size one every speculative row -- each K, the policy, the batch-of-one loop -- runs the same code:
a (1, T) batch decodes through the batch-of-one loop on its unpadded prompt (`specbook.batch.generate_batch`),
so the policy at its K and the fixed K it picked differ only by the noise of the machine (and the batch-of-one
row repeats the largest K's row: their difference shows that noise).
"""

import statistics

import torch
from tqdm.auto import tqdm

from .batch import generate_batch
from .bench import HELD_OUT, INPUT_GROUNDED, OPEN_ENDED, REPETITIVE, _clock, generate_options, machine
from .decoder import forward_name, hugging_face_forward
from .decoding import autoregressive_generate, speculative_generate
from .models import embedding_rows
from .policies import BatchSizeK, check_integer
from .ragged import rows_cache
from .records import acceptance_rate
from .spread import fastest, show_spreads, speedup_range, spread_of, tie_text
from .theory import batch_speedup

COST_ROUNDS = 15  # rounds of call_costs in the batch suite, at least
ONE_AT_A_TIME = "autoregressive, one row at a time"  # the batch's prompts decoded one after another, alone
BATCHED_LOOP = "autoregressive, batched loop"  # at one row: the batched engine, not the batch-of-one loop
MEASURED_POLICY = "measured policy"  # BatchSizeK.from_speedups on the suite's own fixed-K rows


def batch_prompts(count: int) -> list[str]:
    """``count`` prompts of different lengths for a batch: the built-in pair's held-out prompts, then the
    benchmark prompts of chapters 4 to 6, then the held-out prompts cut to their first lines."""
    texts = HELD_OUT + OPEN_ENDED + INPUT_GROUNDED + REPETITIVE
    texts += ["\n".join(text.split("\n")[:2]) for text in HELD_OUT]
    if count > len(texts):
        raise ValueError(f"count must be at most {len(texts)}, the prompts there are (got {count})")
    return texts[:count]


@torch.inference_mode()
def call_costs(model, batch_sizes, positions, context: int = 64, repeats: int = 5) -> dict[int, list[float]]:
    """Median seconds of one call of ``model`` feeding n new positions per row (n in ``positions``) after
    ``context`` tokens, at each batch size: {batch size: [seconds for each n]}. Random tokens: the cost of a
    call does not depend on which tokens it reads. The n are interleaved in every round."""
    costs = {}
    vocab = embedding_rows(model)
    for batch in batch_sizes:
        tokens = torch.randint(vocab, (batch, context + max(positions)), device=model.device)
        cache = rows_cache(model, batch, tokens.shape[1])
        cache(tokens[:, :context], torch.ones(batch, context, dtype=torch.bool), logits_to_keep=1)
        times = {n: [] for n in positions}
        for round_ in range(repeats + 1):  # the first round warms up
            for n in positions:
                started = _clock()
                cache(tokens[:, context: context + n], torch.ones(batch, n, dtype=torch.bool), logits_to_keep=n)
                if round_:
                    times[n].append(_clock() - started)
                cache.forget(n, [0] * batch)
        costs[batch] = [statistics.median(times[n]) for n in positions]
    return costs


def forward_costs(target, draft, batch_sizes, k: int, context: int, rounds: int) -> dict:
    """Per batch size, with `call_costs`: the target's call on 1 .. k + 1 positions per row (``verify_ms``), the
    draft's on one (``draft_ms``), and their ratios, c_B (``cost_ratio``) and v_B(n) (``verify_ratio``)."""
    verify = call_costs(target, batch_sizes, range(1, k + 2), context, rounds)
    drafting = call_costs(draft, batch_sizes, [1], context, rounds)
    return {b: {"verify_ms": [1000 * t for t in verify[b]], "draft_ms": 1000 * drafting[b][0],
                "cost_ratio": drafting[b][0] / verify[b][0], "verify_ratio": [t / verify[b][0] for t in verify[b]]}
            for b in batch_sizes}


def predicted_crossover(alpha: float, costs: dict, k: int) -> int | None:
    """The smallest batch size of ``costs`` (`forward_costs`) where `specbook.theory.batch_speedup` at ``k`` falls
    below 1; None where it stays above at every one, or the costs stop short of k + 1 positions."""
    return next((b for b, cost in sorted(costs.items()) if k < len(cost["verify_ratio"]) and batch_speedup(
        alpha, k, cost["cost_ratio"], cost["verify_ratio"][k]) < 1), None)


def _hugging_face_batch(target, sampler, max_new_tokens):
    options = dict(generate_options(target, sampler, max_new_tokens), min_new_tokens=max_new_tokens)

    def run(input_ids, attention_mask, seed):
        torch.manual_seed(seed)
        output = target.generate(input_ids, attention_mask=attention_mask, **options)
        return output[:, input_ids.shape[1]:].tolist()
    return run


def _assisted_refusal(target, draft, input_ids, attention_mask) -> str | None:
    """What Hugging Face's assisted generation says to a batch (None if it decodes it)."""
    try:
        target.generate(input_ids, attention_mask=attention_mask, assistant_model=draft, max_new_tokens=2,
                        do_sample=False, pad_token_id=target.config.eos_token_id)
    except ValueError as error:
        return str(error).strip().split("\n")[0]
    return None


def batch_suite(pair, batch_sizes, ks, max_new_tokens, repeats, sampler, seed=0, progress=True) -> dict:
    """The batch benchmark (module docstring): one row per (batch size, method), and the costs and policy
    it used. ``speedup_vs_ar`` is over batched autoregressive decoding at the same batch size;
    ``predicted_speedup`` is `specbook.theory.batch_speedup` with the measured alpha, c_B and v_B(K + 1). That
    alpha (``alpha``, for the formula and the policy) is alpha-hat, accepted over tested drafts, pooled over the
    rows of the largest batch -- every prompt the suite decodes at any batch size (``alpha_rows`` of them) -- in
    one generation at the largest K (``alpha_k``), with the suite's sampler.

    ``seconds`` is the median of a method's ``repeats`` rounds, ``seconds_min`` and ``seconds_max`` its
    fastest and slowest; round r runs every method once, so ``speedup_vs_ar_min`` and ``speedup_vs_ar_max``
    are the extremes of the per-round speedups, autoregressive decoding's round-r time over the method's
    (`specbook.bench.speedup_range`). ``fastest`` names, per batch size, the fastest method, the methods
    whose speedup ranges overlap its own (``tied``) and whether it is ``distinguishable`` from the rest
    (`specbook.bench.fastest`). ``batch_sizes`` need not start at 1: the policy carries the K of the
    smallest one measured down to a single row (`BatchSizeK.from_costs`)."""
    if not batch_sizes:
        raise ValueError("batch_sizes must hold at least one batch size (got none)")
    check_integer("repeats", repeats, 1)
    batch_sizes = sorted(set(batch_sizes))
    target, draft = pair.target, pair.draft
    prompts = pair.encode_batch(batch_prompts(max(batch_sizes)))[1]
    context = round(float(prompts.sum(1).float().mean())) + max_new_tokens // 2  # a row's context, half-way through
    rounds = max(repeats, COST_ROUNDS)  # a call is short: many rounds steady its median
    costs = forward_costs(target, draft, batch_sizes, max(ks), context, rounds)
    with hugging_face_forward():  # the same calls on the forward the batch ran on before the decoder served it
        hugging_face_costs = forward_costs(target, draft, batch_sizes, max(ks), context, rounds)
    cost_ratio = {b: costs[b]["cost_ratio"] for b in batch_sizes}
    verify_ratio = {b: costs[b]["verify_ratio"] for b in batch_sizes}
    ids, mask = pair.encode_batch(batch_prompts(max(batch_sizes)))  # every row the suite decodes
    probe = speculative_generate(target, draft, ids, max_new_tokens, k=max(ks), sampler=sampler, seed=seed,
                                 attention_mask=mask)  # alpha, for the formula and the policy
    alpha = acceptance_rate([step for row in probe for step in row.steps])  # accepted over tested, all rows
    policy = BatchSizeK.from_costs(alpha, cost_ratio, verify_ratio)

    def predicted(batch):  # chapter 3's speedup at K with this batch size's measured costs
        return lambda k: batch_speedup(alpha, k, cost_ratio[batch], verify_ratio[batch][k]) if k else 1.0

    def batched_autoregressive(ids, mask):  # every speedup's baseline, as (K, run(seed))
        return 0, lambda s: autoregressive_generate(target, ids, max_new_tokens, sampler, s, attention_mask=mask)

    rows, ranked = [], {}
    for batch in tqdm(batch_sizes, desc="batch sizes", disable=not progress):
        ids, mask = pair.encode_batch(batch_prompts(batch))
        hugging_face = _hugging_face_batch(target, sampler, max_new_tokens)
        methods = {"autoregressive": batched_autoregressive(ids, mask),
                   ONE_AT_A_TIME: (0, lambda s: [autoregressive_generate(
                       target, row[None, shown.bool()], max_new_tokens, sampler, s + b).token_ids
                       for b, (row, shown) in enumerate(zip(ids, mask))]),
                   "hf generate": (0, lambda s: hugging_face(ids, mask, s))}
        if batch == 1:  # the batched engine on one row, without the batch-of-one loop a batch of one takes
            methods[BATCHED_LOOP] = (0, lambda s: generate_batch(target, None, ids, max_new_tokens, 0, sampler, s,
                                                                 attention_mask=mask))
        for k in ks:
            methods[f"speculative k={k}"] = (k, lambda s, k=k: speculative_generate(
                target, draft, ids, max_new_tokens, k=k, sampler=sampler, seed=s, attention_mask=mask))
        methods["batch-size policy"] = (policy.k_for(batch), lambda s: speculative_generate(
            target, draft, ids, max_new_tokens, k=policy, sampler=sampler, seed=s, attention_mask=mask))
        if batch == 1:  # the loop a (1, T) prompt without a mask takes: a batch of one runs it too
            methods[f"batch-of-one loop, k={max(ks)}"] = (max(ks), lambda s: speculative_generate(
                target, draft, ids, max_new_tokens, k=max(ks), sampler=sampler, seed=s))
        timed = _timed(batch, methods, repeats, seed, predicted(batch))
        best, tied, distinguishable = fastest(timed, "speedup_vs_ar", repeats)
        ranked[batch] = {"method": best["method"], "tied": [row["method"] for row in tied],
                         "distinguishable": distinguishable}
        rows += timed
        if batch > 1:
            rows.append({**dict.fromkeys(rows[-1]), "batch_size": batch, "method": "hf assisted",
                         "refused": _assisted_refusal(target, draft, ids, mask)})  # no timing: it refuses
    # the measured policy: each batch size's K from the speedups just measured, timed again beside autoregressive
    # decoding (its rows finish at different times, so it also drafts at the smaller batch sizes' K)
    measured = BatchSizeK.from_speedups({batch: {row["k"]: (row["speedup_vs_ar"], row["speedup_vs_ar_min"])
                                                 for row in rows if row["batch_size"] == batch
                                                 and row["method"].startswith("speculative k=")}
                                         for batch in batch_sizes})
    for batch in tqdm(batch_sizes, desc="measured policy", disable=not progress):
        ids, mask = pair.encode_batch(batch_prompts(batch))
        methods = {"autoregressive": batched_autoregressive(ids, mask),
                   MEASURED_POLICY: (measured.k_for(batch), lambda s: speculative_generate(
                       target, draft, ids, max_new_tokens, k=measured, sampler=sampler, seed=s, attention_mask=mask))}
        rows += _timed(batch, methods, repeats, seed, predicted(batch))[1:]  # the policy's row
    return {"machine": machine(), "target_forward": forward_name(target), "draft_forward": forward_name(draft),
            "pair": pair.name, "max_new_tokens": max_new_tokens, "repeats": repeats,
            "temperature": sampler.temperature, "cost_context": context, "alpha": alpha,
            "alpha_rows": max(batch_sizes), "alpha_k": max(ks), "policy": policy.k_by_batch,
            "measured_policy": measured.k_by_batch,
            "costs": costs, "hugging_face_costs": hugging_face_costs,
            "crossover": {**crossover(rows, 4),
                          "predicted_hugging_face": predicted_crossover(alpha, hugging_face_costs, 4)},
            "fastest": ranked, "rows": rows}


def _timed(batch: int, methods: dict, repeats: int, seed: int, predicted) -> list[dict]:
    """``methods`` ({name: (K, run(seed))}, autoregressive decoding first) timed in ``repeats`` interleaved rounds
    after an untimed one: a row each, its speedup over autoregressive decoding with the spread of the rounds, and
    the speedup ``predicted(K)`` gives."""
    times, outputs = {name: [] for name in methods}, {}
    for _, run in methods.values():
        run(seed)  # untimed: lazy initialisation
    for _ in range(repeats):
        for name, (_, run) in methods.items():
            started = _clock()
            outputs[name] = _per_row(run(seed))
            times[name].append(_clock() - started)
    baseline = statistics.median(times["autoregressive"])
    timed = []
    for name, (k, _) in methods.items():
        (token_ids, generations), seconds = outputs[name], statistics.median(times[name])
        alphas = [g.stats.acceptance_rate for g in generations if k and g.stats.acceptance_rate >= 0]
        low, high = speedup_range(times["autoregressive"], times[name], baseline / seconds)
        timed.append({"batch_size": batch, "method": name, "k": k,
                      "tokens_per_second": sum(map(len, token_ids)) / seconds, "speedup_vs_ar": baseline / seconds,
                      "speedup_vs_ar_min": low, "speedup_vs_ar_max": high,
                      "tokens_per_call": statistics.fmean([g.stats.tokens_per_step for g in generations]) if k
                      else 1.0, "acceptance_rate": statistics.fmean(alphas) if alphas else None,
                      "predicted_speedup": predicted(k), "same_tokens": token_ids == outputs["autoregressive"][0],
                      "seconds": seconds, "seconds_min": min(times[name]), "seconds_max": max(times[name])})
    return timed


def _per_row(output) -> tuple[list[list[int]], list]:
    """Any method's output as (token ids per row, each row's `Generation`, if it has them)."""
    if hasattr(output, "rows"):  # a BatchGeneration
        return output.token_ids, output.rows
    if isinstance(output, list):  # Hugging Face's tokens
        return output, []
    return [output.token_ids], [output]  # the batch-of-one loop


def crossover(rows: list[dict], k: int) -> dict:
    """The smallest batch size where speculative decoding at ``k`` stops paying (speedup below 1), measured (the
    median), measured in every round (``measured_every_round``: the whole spread below 1) and predicted; None
    where it pays at every batch size measured. A row without the spread counts as its median."""
    mine = [row for row in rows if row["method"] == f"speculative k={k}"]  # in increasing batch size
    keys = {"measured": "speedup_vs_ar", "measured_every_round": "speedup_vs_ar_max", "predicted": "predicted_speedup"}
    return {kind: next((row["batch_size"] for row in mine if row.get(key, row["speedup_vs_ar"]) < 1), None)
            for kind, key in keys.items()}


def report(results: dict) -> str:
    """The batch suite's results as text: speedup over batched autoregressive decoding with the spread of the
    rounds, '1.40x (1.35-1.44)', a method per line and a batch size per column; then the costs, the policy, the
    crossover and, per batch size, the fastest method with those tied with it. A results file older than the
    spread columns prints its medians alone."""
    import pandas as pd

    table = show_spreads(pd.DataFrame([row for row in results["rows"] if row.get("speedup_vs_ar") is not None]),
                         ["speedup_vs_ar"])
    crossing = results["crossover"]
    lines = [table.pivot_table(index="method", columns="batch_size", values="speedup_vs_ar", aggfunc="first",
                               sort=False).to_string(),
             f"speedup over batched autoregressive decoding, the median round (the lowest and highest round's); "
             f"{results['machine']}, {results['max_new_tokens']} new tokens per row, {results['repeats']} repeats, "
             f"temperature {results['temperature']}"]
    for forward, key in (("", "costs"), ("Hugging Face's forward, ", "hugging_face_costs")):
        for batch, cost in results.get(key, {}).items():
            ratios = ", ".join(f"{r:.2f}" for r in cost["verify_ratio"])
            lines.append(f"{forward}batch {batch}: a target call on 1..{len(cost['verify_ratio'])} positions per row "
                         f"costs {ratios} x one ({cost['verify_ms'][0]:.1f} ms); c = {cost['cost_ratio']:.3f}")
    batching = {row["batch_size"]: row["tokens_per_second"] for row in results["rows"]
                if row["method"] == ONE_AT_A_TIME}
    plain = [row for row in results["rows"] if row["method"] == "autoregressive" and row["batch_size"] in batching]
    if plain:
        lines.append("batched autoregressive decoding, tokens per second over the same rows decoded one at a time: " +
                     ", ".join(f"{row['tokens_per_second'] / batching[row['batch_size']]:.2f}x at {row['batch_size']}"
                               for row in plain))
    refusals = {row["refused"] for row in results["rows"] if row.get("refused")}
    over = (f" (accepted over tested, {results['alpha_rows']} rows, K = {results['alpha_k']})"
            if "alpha_rows" in results else "")
    lines += [f"alpha = {results['alpha']:.3f}{over}; batch-size policy {results['policy']} (from the costs), "
              f"{results.get('measured_policy', '-')} (from the fixed K's speedups); K = 4 stops paying "
              f"at batch size {crossing['measured']} (measured), {crossing.get('measured_every_round', '-')} (in every "
              f"round), {crossing['predicted']} (predicted; {crossing.get('predicted_hugging_face', '-')} from the "
              "costs of Hugging Face's forward)",
              *(f"hf assisted at batch size > 1: {refusal}" for refusal in refusals)]
    for batch, ranked in results.get("fastest", {}).items():
        rows = {row["method"]: row for row in results["rows"] if str(row["batch_size"]) == str(batch)
                and row.get("speedup_vs_ar") is not None}
        best, policy = rows[ranked["method"]], rows["batch-size policy"]
        standing = ("is the fastest" if policy is best else "is within the fastest's spread" if policy["method"]
                    in ranked["tied"] else "is below the fastest's spread")
        tied = tie_text(ranked["tied"], ranked["distinguishable"])
        measured = (f"; the measured policy (K = {rows[MEASURED_POLICY]['k']}), "
                    f"{spread_of(rows[MEASURED_POLICY], 'speedup_vs_ar')}" if MEASURED_POLICY in rows else "")
        lines.append(f"batch {batch}: fastest {best['method']}, {spread_of(best, 'speedup_vs_ar')}, {tied}; the "
                     f"batch-size policy (K = {policy['k']}), {spread_of(policy, 'speedup_vs_ar')}, {standing}"
                     f"{measured}")
    return "\n".join(lines)
