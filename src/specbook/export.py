"""The built-in pair and its drafters in the folders serving engines load.

vLLM (``LLM(model=FOLDER)``, ``speculative_config={"model": FOLDER, ...}``) and SGLang (``--model-path``,
``--speculative-draft-model-path``) read a model from a folder holding its ``config.json``, its weights and
its tokenizer. The package keeps one tokenizer for a pair, beside its models; `export_pair` writes each
model into a folder of its own with a copy of that tokenizer:

    python -m specbook export --out served/          # served/target, served/draft, served/pard

- ``target``, ``draft``: Llama models as `transformers` saves them, which both engines load as they are.
- ``pard``: the draft adapted to draft in parallel (chapter 6c, `specbook.drafters.pard`). Its config names
  the mask token, ``pard_token``, the key vLLM reads for ``parallel_drafting`` (``vllm/config/speculative.py``).
"""

import json
import shutil
from pathlib import Path

from .models import BUILT_IN, assets_dir

SERVED = ("target", "draft", "pard")  # the models `export_pair` writes by default
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
    available = sorted(path.parent.name for path in root.glob("*/config.json")  # models, not heads
                       if "architectures" in json.loads(path.read_text()))
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
        for file in MODEL_FILES:
            if (root / model / file).is_file():
                shutil.copy2(root / model / file, folder / file)
        for file in TOKENIZER_FILES:
            shutil.copy2(root / file, folder / file)
        folders[model] = folder
    return folders
