"""The drafters trained otherwise that the ablation suites compare with the built-in ones, labelled by what sets them
apart: EAGLE-3 heads (``bench --suite eagle3 --eagle3-variants``) and PARD drafts (``bench --suite pard
--pard-variants``), each a folder that ``python -m specbook.train`` wrote with its training.json."""

import json
from pathlib import Path

from .eagle3 import Eagle3Head
from .models import assets_dir, load_model


def eagle3_heads(pair, variants=None) -> dict:
    """The EAGLE-3 heads to compare, by label: the built-in one, "EAGLE-3", then every head saved in a folder of
    ``variants`` (``python -m specbook.train --stages eagle3 --eagle3-dir ...``), labelled by what sets it apart
    from the built-in one: its feature layers, its training-time test's steps (training.json's ``ttt_steps``), or
    its draft vocabulary."""
    folders = [assets_dir(pair.name) / "eagle3"]
    if variants is not None:
        folders += sorted(folder for folder in Path(variants).iterdir() if (folder / "config.json").is_file())
    heads, built_in = {}, None
    for folder in folders:
        head = Eagle3Head.from_pretrained(folder, pair.target)
        head.ttt_steps = json.loads((folder / "training.json").read_text()).get("ttt_steps")
        built_in = built_in or head
        differences = []
        if head.feature_layers != built_in.feature_layers:
            differences.append("on the features alone" if head.feature_layers == (-1,) else
                               "on layers " + ", ".join(map(str, head.feature_layers)))
        if head.ttt_steps != built_in.ttt_steps:
            differences.append("without training-time test" if head.ttt_steps == 1 else
                               f"with a {head.ttt_steps}-step training-time test")
        if len(head.vocab) != len(built_in.vocab):
            differences.append(f"trained on a {len(head.vocab)}-token draft vocabulary")
        if head is not built_in and not differences:  # trained like the built-in head: its folder tells it apart
            differences.append(f"({folder.name})")
        heads[" ".join(["EAGLE-3", *differences])] = head
    return heads


def pard_variants(pair, folder=None) -> dict:
    """The PARD drafts trained otherwise than the built-in one, by label, with their training records: the built-in
    "pard-text" (trained on the corpus, not on the target's greedy continuations), then every draft saved in a folder
    of ``folder`` (``python -m specbook.train --stages pard --pard-dir ...``), labelled by what its training.json
    sets apart: no COD (keep ratio 1), another keep ratio, another number of depths, the corpus, the rows weighted by
    their chance of being verified (``--pard-reached``), corpus windows mixed in (``--pard-corpus``), or another number
    of the model's layers (``--pard-layers``)."""
    built_in = json.loads((assets_dir(pair.name) / "pard" / "training.json").read_text())
    built_in_layers = json.loads((assets_dir(pair.name) / "pard" / "config.json").read_text())["num_hidden_layers"]
    folders = [assets_dir(pair.name) / "pard-text"]
    if folder is not None:
        folders += sorted(path for path in Path(folder).iterdir() if (path / "config.json").is_file())
    variants = {}
    for path in folders:
        meta = json.loads((path / "training.json").read_text())
        differences = []
        if meta["cod"]["ratio"] != built_in["cod"]["ratio"]:
            differences.append("without COD" if meta["cod"]["ratio"] == 1 else
                               f"with COD's keep ratio {meta['cod']['ratio']:g}")
        if meta["depths"] != built_in["depths"]:
            differences.append(f"with {meta['depths']} depths")
        if meta.get("greedy_windows") != built_in.get("greedy_windows"):
            differences.append("trained on the corpus")
        elif (windows := meta.get("corpus_windows", 0)) != built_in.get("corpus_windows", 0):  # in the greedy ones
            differences.append(f"with {windows} corpus windows" if windows else "without corpus windows")
        if meta.get("reached", False) != built_in.get("reached", False):
            differences.append("weighted by reach" if meta.get("reached") else "unweighted")
        model = load_model(str(path.parent), path.name, pair.target.device, pair.target.dtype)
        if model.config.num_hidden_layers != built_in_layers:
            differences.append(f"of {model.config.num_hidden_layers} layers")
        if not differences:
            differences.append(f"({path.name})")
        variants[" ".join(["PARD", *differences])] = (model, meta)
    return variants
