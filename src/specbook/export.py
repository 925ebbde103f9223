"""The built-in pair and its drafters in the folders serving engines load.

vLLM (``LLM(model=FOLDER)``, ``speculative_config={"model": FOLDER, ...}``) and SGLang (``--model-path``,
``--speculative-draft-model-path``) read a model from a folder holding its ``config.json``, its weights and
its tokenizer. The package keeps one tokenizer for a pair, beside its models; `export_pair` writes each
model into a folder of its own with a copy of that tokenizer:

    python -m specbook export --out served/          # served/target, served/draft, served/pard

- ``target``, ``draft``: Llama models as `transformers` saves them, which both engines load as they are.
- ``pard``: the draft adapted to draft in parallel (chapter 6c, `specbook.drafters.pard`). Its config names
  the mask token, ``pard_token``, the key vLLM reads for ``parallel_drafting`` (``vllm/config/speculative.py``).
- ``eagle3``: the EAGLE-3 head (`specbook.eagle3`) in the layout of EAGLE-3's checkpoints, which vLLM's
  ``llama_eagle3`` and SGLang load: ``fc`` (the fusion of the target's three hidden states), one layer
  ``layers.0`` whose q, k and v read [embedding; feature] with a norm for each (``input_layernorm``,
  ``hidden_norm``), ``norm``, an ``lm_head`` over the draft vocabulary, and for a reduced one ``d2t`` (draft
  row -> target id, as an offset) and ``t2d`` (target ids the draft has). The config names the target layers
  it reads (``eagle_config.eagle_aux_hidden_state_layer_ids``) and ``norm_output``: a drafted step feeds the
  head its normed output, as the package's drafter does. The token embedding is the target's, not written.
  ``specbook_target`` fingerprints the target the head was trained on, which `specbook.vllm_runs` checks.
"""

import hashlib
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .heads import LAYER_FIELDS
from .models import BUILT_IN, assets_dir

SERVED = ("target", "draft", "pard", "eagle3")  # what `export_pair` writes by default
HEADS = ("eagle3",)  # heads it writes, in the layout of their serving engines
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors")


def pair_root(name: str) -> Path:
    """The folder of a built-in decoder-only pair, or of one `specbook.train` wrote; refused otherwise."""
    root = assets_dir(name) if name in BUILT_IN else Path(name)
    if not all((root / file).is_file() for file in TOKENIZER_FILES) or not (root / "target").is_dir():
        raise ValueError(f"name must be a built-in pair {list(BUILT_IN)} or a folder specbook.train wrote (a "
                         f"tokenizer and target/ beside it) (got {name!r})")
    return root


def export_pair(out, name: str = "shakespeare", models=SERVED) -> dict[str, Path]:
    """Write each of ``models`` of the pair ``name`` to ``out``/MODEL, with the pair's tokenizer beside its config.

    Returns the folders written, by model. Refuses an encoder-decoder pair (vLLM's speculative decoding serves
    decoder-only models), a model the pair lacks, and an ``out`` that is a file. A folder already there is
    replaced.
    """
    root, out = pair_root(name), Path(out)
    if out.is_file():
        raise ValueError(f"out must be a folder (got the file {str(out)!r})")
    available = sorted(path.parent.name for path in root.glob("*/config.json")  # models, and the heads served
                       if "architectures" in json.loads(path.read_text()) or path.parent.name in HEADS)
    models = [models] if isinstance(models, str) else list(models)
    unknown = [model for model in models if model not in available]
    if not models or unknown:
        raise ValueError(f"models must name models of {name!r}, from {available} (got {models})")
    if json.loads((root / "target" / "config.json").read_text()).get("is_encoder_decoder"):
        raise ValueError(f"{name!r} is an encoder-decoder pair: vLLM's speculative decoding serves decoder-only "
                         "models")
    folders = {}
    for model in models:
        folder = out / model
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        if model in HEADS:
            write_eagle3(root / model, folder, root / "target")
        else:
            for file in MODEL_FILES:
                if (root / model / file).is_file():
                    shutil.copy2(root / model / file, folder / file)
        for file in TOKENIZER_FILES:
            shutil.copy2(root / file, folder / file)
        folders[model] = folder
    return folders


def fingerprint(model_folder) -> str:
    """A short hash of a model's weights file: which target a head was trained on."""
    return hashlib.sha256((Path(model_folder) / "model.safetensors").read_bytes()).hexdigest()[:16]


def write_eagle3(head_folder, folder, target_folder) -> None:
    """The EAGLE-3 head saved in ``head_folder`` (`specbook.eagle3.Eagle3Head.save`), for the target in
    ``target_folder``, written to ``folder`` as an EAGLE-3 checkpoint (the module's docstring)."""
    head_folder, folder = Path(head_folder), Path(folder)
    config = json.loads((head_folder / "config.json").read_text())
    if config.get("kind") != "eagle3":
        raise ValueError(f"{head_folder} holds no EAGLE-3 head (its kind: {config.get('kind')!r})")
    if -1 in config["feature_layers"]:
        raise ValueError(f"the head in {head_folder} reads the target's final norm (feature layer -1): EAGLE-3's "
                         "servers read the residual stream after given layers only")
    weights = load_file(head_folder / "model.safetensors")
    folder.mkdir(parents=True, exist_ok=True)
    if "layer.layers.0.hidden_norm.weight" not in weights:
        raise ValueError(f"the head in {head_folder} has EAGLE's fc before a stock layer, which no server loads: "
                         "retrain it (python -m specbook.train --stages eagle3)")
    renamed = {"fc.weight": weights.pop("fuse.weight"), "lm_head.weight": weights.pop("lm_head.weight")}
    for name, tensor in weights.items():
        if name.startswith("layer.") and name != "layer.embed_tokens.weight":  # the stock stack's unused embedding
            renamed[name.removeprefix("layer.")] = tensor
    vocab, target_vocab = config["vocab"], config["target_vocab"]
    if len(vocab) < target_vocab:
        renamed["d2t"] = torch.tensor(vocab) - torch.arange(len(vocab))  # target id = draft row + d2t[row]
        renamed["t2d"] = torch.zeros(target_vocab, dtype=torch.bool).index_fill_(0, torch.tensor(vocab), True)
    save_file({name: tensor.contiguous() for name, tensor in renamed.items()}, folder / "model.safetensors")
    layer = {name: config[name] for name in LAYER_FIELDS if name in config}  # the head's layer, as it saved them
    served = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", **layer, "num_hidden_layers": 1,
              "vocab_size": target_vocab, "draft_vocab_size": len(vocab), "target_hidden_size": layer["hidden_size"],
              "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False, "norm_output": True,
              "eagle_config": {"eagle_aux_hidden_state_layer_ids": config["feature_layers"],
                               "use_aux_hidden_state": True},
              "dtype": "float16", "specbook_target": fingerprint(target_folder)}
    (folder / "config.json").write_text(json.dumps(served, indent=2))
