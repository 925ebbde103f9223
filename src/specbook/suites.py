"""The benchmark suites: the methods each chapter's table compares, as lists of `specbook.bench.Method` rows.

Each function builds one table's rows from a model pair (and, for chapter 6, heads trained on its target);
`specbook.bench.run_benchmark` times them, and ``python -m specbook bench --suite NAME`` runs them from the shell
(`specbook.cli_bench`). The first row is always the baseline, autoregressive decoding of the same target, so the
runner's speedups are ratios against it.
"""

from dataclasses import replace

from .bench import autoregressive, hugging_face_assisted, speculative
from .drafters import (BlockwiseDrafter, Eagle3Drafter, EagleDrafter, LookaheadDrafter, MedusaDrafter, ModelDrafter,
                       NGramDrafter, OuroborosDrafter, PardDrafter, PromptLookupDrafter, SampledTreeDrafter,
                       SelfSpeculativeDrafter, TopKTreeDrafter)
from .drafters.glide import CaPE, GlideDrafter
from .drafters.medusa import DEFAULT_TREE
from .policies import ConfidenceStop, EntropyGuidedK, HeuristicK
from .trees import DynamicTree, TreeSpec


def comparison(pair, sampler, max_new_tokens, ks=(1, 2, 3, 4, 6), hf=True):
    """Chapter 4's table: autoregressive, speculative with each K, and Hugging Face assisted generation."""
    methods = [autoregressive(pair.target, sampler, max_new_tokens)]
    methods += [speculative(pair.target, pair.draft, k, sampler, max_new_tokens) for k in ks]
    if hf:
        methods += [hugging_face_assisted(pair.target, pair.draft, sampler, max_new_tokens),
                    hugging_face_assisted(pair.target, pair.draft, sampler, max_new_tokens, k=max(ks))]
    return methods


def encoder_decoder(pair, own_encoder_draft, sampler, max_new_tokens, ks=(2, 4, 6), eos_token_id=None):
    """Chapter 4b's table, for an encoder-decoder pair whose draft can read the target's encoder states:
    autoregressive; the draft on the target's encoder at each K; a draft with its own encoder and prompt
    lookup (from the encoder's input) at the largest K; Hugging Face's assisted generation with the same
    draft, its own schedule and the largest K. Every method stops at ``eos_token_id``."""
    k, target = max(ks), pair.target
    shared = [speculative(target, ModelDrafter(pair.draft, encoder="target"), length, sampler, max_new_tokens,
                          f"draft on the target's encoder, k={length}", eos_token_id=eos_token_id) for length in ks]
    return [autoregressive(target, sampler, max_new_tokens, eos_token_id=eos_token_id), *shared,
            speculative(target, ModelDrafter(own_encoder_draft), k, sampler, max_new_tokens,
                        f"draft with its own encoder, k={k}", eos_token_id=eos_token_id),
            speculative(target, PromptLookupDrafter(), k, sampler, max_new_tokens, f"prompt lookup, k={k}",
                        eos_token_id=eos_token_id),
            hugging_face_assisted(target, pair.draft, sampler, max_new_tokens, eos_token_id=eos_token_id),
            hugging_face_assisted(target, pair.draft, sampler, max_new_tokens, k, eos_token_id=eos_token_id)]


def ablation(pair, sampler, max_new_tokens, k=4, sweep=()):
    """Chapter 5's table: the model drafter with fixed K and with EGAG, NASD with and without EGAG, prompt lookup.

    The lookup drafters draft up to ``k``; the model drafter's fixed K is ``k`` and every K in ``sweep``,
    so that EGAG meets the best fixed K rather than one chosen in advance.
    """
    return [
        autoregressive(pair.target, sampler, max_new_tokens),
        *[speculative(pair.target, pair.draft, fixed, sampler, max_new_tokens, name=f"draft model, k={fixed}")
          for fixed in sorted({k, *sweep})],
        speculative(pair.target, pair.draft, EntropyGuidedK(), sampler, max_new_tokens, name="draft model, EGAG"),
        speculative(pair.target, NGramDrafter(), k, sampler, max_new_tokens, name=f"NASD, k={k}"),
        speculative(pair.target, NGramDrafter(), EntropyGuidedK(), sampler, max_new_tokens, name="NASD, EGAG"),
        speculative(pair.target, PromptLookupDrafter(), k, sampler, max_new_tokens, name=f"prompt lookup, k={k}"),
    ]


def heads_and_trees(pair, medusa, eagle, sampler, max_new_tokens, k=4, stop_threshold=0.1):
    """Chapter 6's table: the draft model as a chain and as a token tree, Medusa and EAGLE as chains and trees.

    ``medusa`` and ``eagle`` are heads trained on ``pair.target`` (`specbook.heads.MedusaHeads`,
    `EagleHead`). Every tree has one shape, Medusa's sparse 16-node tree (`DEFAULT_TREE`, drafted
    to depth k; Medusa's is cut to the heads there are), so the rows differ only in who drafts.
    The draft model's tree holds its top candidates when decoding is greedy and independent samples
    from p otherwise (`TopKTreeDrafter`, `SampledTreeDrafter`): a deterministic candidate x passes
    with probability q(x) only, which is small wherever q is spread out. The heads always draft
    their top candidates. Two rows try Lu et al. 2024's improvements on the model's tree: a depth
    that adapts during generation (the same tree with its main line going on to depth 2k, under
    `HeuristicK` between 1 and 2k), and early stopping (the tree stops growing after a depth whose
    best candidate the draft gives less than ``stop_threshold``: `ConfidenceStop`,
    `specbook.drafters.tree`).
    """
    target, tree = pair.target, DEFAULT_TREE.truncated(k)
    model_tree = TopKTreeDrafter if sampler.greedy else SampledTreeDrafter
    deep = TreeSpec(tree.paths + [(0,) * depth for depth in range(tree.depth + 1, 2 * k + 1)])
    medusa_tree = tree.truncated(medusa.num_heads)  # a head per depth
    return [
        autoregressive(target, sampler, max_new_tokens),
        speculative(target, pair.draft, k, sampler, max_new_tokens, name=f"draft model, chain k={k}"),
        speculative(target, model_tree(pair.draft, tree), k, sampler, max_new_tokens,
                    name=f"draft model, {len(tree)}-node tree"),
        speculative(target, model_tree(pair.draft, deep), HeuristicK(k, 1, 2 * k), sampler, max_new_tokens,
                    name="draft model, tree, adaptive depth"),
        speculative(target, model_tree(pair.draft, tree), ConfidenceStop(stop_threshold, k), sampler,
                    max_new_tokens, name="draft model, tree, early stop"),
        speculative(target, MedusaDrafter(target, medusa, tree=None), k, sampler, max_new_tokens,
                    name=f"Medusa, chain k={k}"),
        speculative(target, MedusaDrafter(target, medusa, tree=medusa_tree), k, sampler, max_new_tokens,
                    name=f"Medusa, {len(medusa_tree)}-node tree"),
        speculative(target, EagleDrafter(target, eagle), k, sampler, max_new_tokens, name=f"EAGLE, chain k={k}"),
        speculative(target, EagleDrafter(target, eagle, tree=tree), k, sampler, max_new_tokens,
                    name=f"EAGLE, {len(tree)}-node tree"),
    ]


EAGLE2_TREE = DynamicTree(5, 3, 16)  # EAGLE-2's dynamic tree in the family: depth 5, 3 expanded a depth, 16 nodes


def family(pair, medusa, eagle, exit_head, sampler, max_new_tokens, k=4, glide=None, glide_control=None, eagle3=None,
           pard=None, **path):
    """Chapter 6's comparison of every method the book runs, on one target: each drafter at the setting
    the book found good for it. Chains draft up to ``k``; every static tree is Medusa's 16-node tree
    (`DEFAULT_TREE`, depth 4), every dynamic one EAGLE-2's (depth 5, width 3, 16 nodes); lookahead
    has a window of 5, 4-grams and 5 candidates; the heads (``medusa``, ``eagle``, ``exit_head``) are
    trained on ``pair.target``. Under sampling the draft model's tree is sampled, not its top-k.

    Then the seeds' systems (chapter 6c): Medusa's heads as a chain, and as blockwise parallel
    decoding (greedy only: no row under sampling) in blocks of the pending token and every head;
    Ouroboros, the draft model's chain of ``k`` extended by three pooled phrases of three tokens (its
    pool warm from the runs before); and, given ``glide`` (a `specbook.glide.GlideForCausalLM` for
    ``pair.target``) and ``glide_control`` (the same draft trained the same way without
    cross-attention), GliDe's chain, GliDe with CaPE and the control's chain; given ``eagle3`` (a
    `specbook.eagle3.Eagle3Head` for ``pair.target``), EAGLE-3's chain and dynamic tree; given ``pard`` (a PARD
    draft, `specbook.drafters.PardDrafter`), its chain of ``k`` from one call. Multi-token prediction
    changes the target, so its rows have a baseline of their own (`multi_token`). ``path``: the engine's
    ``cache`` and ``compile`` for every row (``cache="static"``: the GPU path).
    """
    target, tree, dynamic = pair.target, DEFAULT_TREE, EAGLE2_TREE
    model_tree = TopKTreeDrafter if sampler.greedy else SampledTreeDrafter
    rows = [
        ("draft model, chain", pair.draft, k),
        ("draft model, chain, EGAG", pair.draft, EntropyGuidedK()),
        (f"draft model, {len(tree)}-node tree (top-k greedy, sampled otherwise)", model_tree(pair.draft, tree),
         tree.depth),
        ("prompt lookup", PromptLookupDrafter(), k),
        ("NASD", NGramDrafter(), k),
        ("lookahead (W=5, N=4, G=5)", LookaheadDrafter(5, 4, 5), 3),
        (f"Medusa, {len(tree)}-node tree", MedusaDrafter(target, medusa, tree=tree), tree.depth),
        ("EAGLE, chain", EagleDrafter(target, eagle), k),
        (f"EAGLE, {len(tree)}-node tree", EagleDrafter(target, eagle, tree=tree), tree.depth),
        (f"EAGLE-2, dynamic {dynamic.nodes}-node tree", EagleDrafter(target, eagle, tree=dynamic), dynamic.depth),
        (f"self-speculative, exit after layer {exit_head.exit_layer}", SelfSpeculativeDrafter(target, exit_head), k),
        ("Medusa, chain", MedusaDrafter(target, medusa, tree=None), medusa.num_heads),
    ]
    if eagle3 is not None:
        rows += [("EAGLE-3, chain", Eagle3Drafter(target, eagle3), k),
                 (f"EAGLE-3, dynamic {dynamic.nodes}-node tree", Eagle3Drafter(target, eagle3, tree=dynamic),
                  dynamic.depth)]
    if sampler.greedy:
        rows.append((f"blockwise, blocks of {medusa.num_heads + 1}", BlockwiseDrafter(target, medusa),
                     medusa.num_heads))
    rows.append(("Ouroboros, chain + phrases", OuroborosDrafter(pair.draft, phrase_length=3, chain=k), k + 3))
    if pard is not None:
        rows.append(("PARD, chain", PardDrafter(pard), k))
    if glide is not None:
        rows += [("GliDe, chain", GlideDrafter(glide), k), ("GliDe + CaPE", GlideDrafter(glide, cape=CaPE()), k),
                 ("GliDe's control (no cross-attention), chain", glide_control, k)]
    return [autoregressive(target, sampler, max_new_tokens, **path)] + [
        speculative(target, drafter, length, sampler, max_new_tokens, name=name, **path)
        for name, drafter, length in rows]


def eagle3_rows(pair, eagle, heads: dict, sampler, max_new_tokens, k=4, vocab=None, **path):
    """EAGLE against EAGLE-3 (`specbook.eagle3`): each as a chain of ``k`` and as EAGLE-2's dynamic tree, then a chain
    for every other EAGLE-3 head of ``heads`` (name -> head; the first is the built-in one: ablations such as no
    training-time test, or the top layer's feature alone), and, given ``vocab`` (a number of tokens), the first
    head's chain with that reduced draft vocabulary. ``path`` as for `family`."""
    target, dynamic = pair.target, EAGLE2_TREE
    (name, head), *others = heads.items()
    rows = [("EAGLE, chain", EagleDrafter(target, eagle), k),
            (f"EAGLE-2, dynamic {dynamic.nodes}-node tree", EagleDrafter(target, eagle, tree=dynamic), dynamic.depth),
            (f"{name}, chain", Eagle3Drafter(target, head), k),
            (f"{name}, dynamic {dynamic.nodes}-node tree", Eagle3Drafter(target, head, tree=dynamic), dynamic.depth)]
    rows += [(f"{other}, chain", Eagle3Drafter(target, other_head), k) for other, other_head in others]
    if vocab is not None:
        rows.append((f"{name}, chain, {vocab}-token draft vocabulary",
                     Eagle3Drafter(target, head.with_vocabulary(vocab)), k))
    return [autoregressive(target, sampler, max_new_tokens, **path)] + [
        speculative(target, drafter, length, sampler, max_new_tokens, name=row, **path)
        for row, drafter, length in rows]


def parallel_drafting(pair, pard, sampler, max_new_tokens, ks=(1, 2, 3, 4, 5, 6), pard_ks=(2, 3, 4, 5, 6, 8),
                      variants=None, **path):
    """Chapter 6d's table: the draft model drafting K tokens with K calls, at each of ``ks``, against ``pard``, its
    PARD adaptation (`specbook.drafters.pard`), drafting K with one call, at each of ``pard_ks``; then each PARD draft
    of ``variants`` (name -> model: trained otherwise) at K = 4. ``path`` as for `family`."""
    target = pair.target
    rows = [(f"draft model, k={k}", pair.draft, k) for k in ks]
    rows += [(f"PARD, k={k}", PardDrafter(pard), k) for k in pard_ks]
    rows += [(f"{name}, k=4", PardDrafter(model), 4) for name, model in (variants or {}).items()]
    return [autoregressive(target, sampler, max_new_tokens, **path)] + [
        speculative(target, drafter, k, sampler, max_new_tokens, name=name, **path) for name, drafter, k in rows]


TREE_SIZES = (4, 8, 16, 32, 48)  # the tree suite's budgets of nodes verified per call


def tree_name(nodes: int) -> str:
    """The name of `tree_sizes`'s row for a tree of ``nodes`` nodes."""
    return f"draft model, dynamic tree, {nodes} nodes"


def tree_sizes(pair, sampler, max_new_tokens, sizes=TREE_SIZES, depth=4, **path):
    """How tokens per call and time per step grow with a tree's size: the draft model's chain of ``depth``, then its
    dynamic tree (`DynamicTree`: ``depth`` deep, 4 wide) verifying each of ``sizes`` nodes per call. ``path`` as
    for `family` (``cache="static"``: the GPU path, where a wide call costs about what a narrow one does)."""
    rows = [(f"draft model, chain k={depth}", pair.draft)] + [
        (tree_name(nodes), TopKTreeDrafter(pair.draft, DynamicTree(depth, 4, nodes))) for nodes in sizes]
    return [autoregressive(pair.target, sampler, max_new_tokens, **path)] + [
        speculative(pair.target, drafter, depth, sampler, max_new_tokens, name=name, **path) for name, drafter in rows]


def multi_token(mtp_target, heads, sampler, max_new_tokens, **path):
    """Multi-token prediction's rows (`specbook.mtp`): the jointly trained model decoding alone, its baseline,
    then drafting for itself with its heads as a chain (all n - 1 of them). ``path`` as for `family`."""
    drafter = MedusaDrafter(mtp_target, heads, tree=None)
    return [replace(autoregressive(mtp_target, sampler, max_new_tokens, **path), name="MTP model, autoregressive"),
            speculative(mtp_target, drafter, heads.num_heads, sampler, max_new_tokens,
                        name="MTP heads, chain (vs the MTP model)", **path)]
