"""The cost probe: what a real pair would do on this machine, without downloading it.

Chapter 3's speedup needs two numbers besides alpha: the draft's cost per step relative to the target's,
c, and what a target call that scores n positions costs relative to one that scores one, the verification
cost v(n). Both depend on the models' shapes and the machine, not on their weights. So the probe builds
real pairs from their published shapes (the Hugging Face configs in ``assets/configs``) with random
weights, and times the calls speculative decoding makes, as the engine's GPU path makes them
(`specbook.decoding`): batch one, a static KV cache after ``context`` tokens, each call one replayed CUDA
graph on a GPU (`specbook.graphs`). It returns

- c = (draft step on one position) / (target call on one position);
- v(n) = (target call on n positions) / (target call on one), n = 1 .. K + 1;
- the kernels of each model's call on one position (`specbook.kernels.count_kernels`, with the forward
  the engine runs: `specbook.decoder` where it serves the family);
- the bandwidth the one-position target call reaches (its weight bytes over its time,
  `specbook.models.weight_bytes`) against the device's copy bandwidth (`specbook.profile.copy_bandwidth`);
- the predicted speedup for each alpha in `ALPHAS` at each K, Leviathan et al. Theorem 3.8 with the
  measured c and a target call that costs v(K + 1) (`specbook.theory.batch_speedup`), and the best K.

``scale`` shrinks both models of a pair for a small machine: it divides every width (hidden size,
intermediate size, head dimension, vocabulary) by ``scale``, so every weight matrix holds scale^2 fewer
numbers, and keeps the number of layers and of heads. A call then launches the same kernels as at full
size, and the target's weights stay the same multiple of the draft's. The timings are those of smaller
matrices, though: a scaled probe shows the method, a full-size probe on a GPU the numbers.

    results = cost_probe(["llama-3.1-8b"], scale=32, k_max=4, repeats=3, context=16)
    print(report(results))
"""

import gc
import json
import statistics
from pathlib import Path

import torch
from tqdm.auto import tqdm

from . import graphs
from .bench import _clock
from .cache import rollback
from .decoding import STATIC_BLOCK
from .decoder import forward_name
from .gpu import environment
from .kernels import count_kernels
from .models import assets_dir, default_dtype, weight_bytes
from .profile import copy_bandwidth
from .theory import batch_speedup, expected_tokens_per_step, speedup

PAIRS = {  # pair name -> (target, draft): files in assets/configs
    "llama-3.1-8b": ("Llama-3.1-8B", "Llama-3.2-1B"),
    "qwen2.5-7b": ("Qwen2.5-7B", "Qwen2.5-0.5B"),
}
ALPHAS = (0.5, 0.6, 0.7, 0.8, 0.9)
WIDTHS = ("hidden_size", "intermediate_size", "head_dim", "vocab_size")  # the fields a scale divides
INIT_STD = 0.02  # the random weights' standard deviation, Hugging Face's initializer_range
MEMORY_MARGIN = 0.9  # the share of free memory the weights of a pair may take
CPU_SCALE = 8  # the command line's scale off a GPU: the 8B target in 0.5 GB of float32, not 32 GB


def configs_dir() -> Path:
    return assets_dir("configs")


def published_config(name: str) -> dict:
    """The config fields of model ``name`` (a file in assets/configs, e.g. "Llama-3.1-8B") as a dict."""
    path = configs_dir() / f"{name}.json"
    if not path.exists():
        known = sorted(file.stem for file in configs_dir().glob("*.json"))
        raise ValueError(f"name must be one of {known} (got {name!r})")
    return json.loads(path.read_text())


def _scale_problem(fields: dict, scale: int) -> str | None:
    """Why ``scale`` cannot shrink a model with config ``fields``, or None if it can."""
    for width in WIDTHS:
        if fields[width] % scale:
            return f"{width} {fields[width]} is not a multiple of {scale}"
    if fields["head_dim"] // scale % 2:  # rotary embeddings turn pairs of dimensions
        return f"head_dim {fields['head_dim']} / {scale} is not even"
    return None


def allowed_scales(pair: str) -> list[int]:
    """The scales that shrink both models of ``pair`` (every width divisible, an even head dimension)."""
    models = [published_config(name) for name in PAIRS[_check_pair(pair)]]
    largest = min(fields["head_dim"] for fields in models)
    return [scale for scale in range(1, largest + 1) if not any(_scale_problem(f, scale) for f in models)]


def scaled_config(name: str, scale: int = 1):
    """The Hugging Face config of model ``name`` with every width divided by ``scale`` (module docstring)."""
    from transformers import AutoConfig

    fields = published_config(name)
    _check_positive(scale, "scale")
    problem = _scale_problem(fields, scale)
    if problem:
        raise ValueError(f"scale {scale} cannot shrink {name}: {problem}")
    fields.update({width: fields[width] // scale for width in WIDTHS})
    return AutoConfig.for_model(**fields)


def _check_pair(pair) -> str:
    if pair not in PAIRS:
        raise ValueError(f"pairs must be names from {tuple(PAIRS)} (got {pair!r})")
    return pair


def _check_scale(pair: str, scale) -> None:
    _check_positive(scale, "scale")
    allowed = allowed_scales(pair)
    if scale not in allowed:
        raise ValueError(f"scale must be one of {', '.join(map(str, allowed))} for the {pair} pair, the scales that "
                         f"divide its models' {', '.join(WIDTHS)} and leave an even head_dim (got {scale})")


def _check_positive(value, name: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1 (got {value!r})")


def _check_options(pairs, scale, k_max, repeats, context) -> None:
    """ValueError naming the first option out of range, before anything is built or timed."""
    for pair in pairs:
        _check_pair(pair)
        _check_scale(pair, scale)
    for value, name in ((k_max, "k_max"), (repeats, "repeats"), (context, "context")):
        _check_positive(value, name)
    room = min(published_config(name)["max_position_embeddings"] for pair in pairs for name in PAIRS[pair])
    if context + k_max + 1 > room:
        raise ValueError(f"context + k_max + 1 must be at most {room}, the positions the models hold (got "
                         f"{context} + {k_max} + 1)")


def _free_bytes(device: torch.device) -> int | None:
    """Memory free for new tensors on ``device`` (None where this cannot tell)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        meminfo = Path("/proc/meminfo").read_text()
    except OSError:
        return None
    for line in meminfo.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def _check_memory(configs, device, dtype, label: str) -> None:
    """ValueError before building models with ``configs`` whose weights would not fit on ``device``."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):  # shapes only: no memory, no initialisation
        needed = sum(weight_bytes(AutoModelForCausalLM.from_config(config, dtype=dtype)) for config in configs)
    free = _free_bytes(device)
    if free is not None and needed > MEMORY_MARGIN * free:
        raise ValueError(f"the {label} needs {needed / 1e9:.1f} GB of weights in {str(dtype).removeprefix('torch.')} "
                         f"and {device} has {free / 1e9:.1f} GB free: pass a larger scale")


def build_model(config, device="cpu", dtype=torch.float32, seed: int = 0):
    """A causal LM with ``config`` and random weights on ``device``, in ``dtype``, in eval mode.

    The weights are allocated uninitialised on the device (Hugging Face's ``no_init_weights``: its
    default initialisation of an 8B model on a CPU takes minutes), then filled: matrices from
    N(0, INIT_STD^2), norm weights 1, biases 0. Their values do not change what a call costs.
    """
    from transformers import AutoModelForCausalLM

    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # older transformers keep it in modeling_utils
        from transformers.modeling_utils import no_init_weights

    device = torch.device(device)
    with torch.device(device), no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.tie_weights()  # skipped with the initialisation
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():  # a tied matrix once
            if param.ndim > 1:
                param.normal_(0.0, INIT_STD, generator=generator)
            elif name.endswith("bias"):
                param.zero_()
            else:  # RMSNorm weights
                param.fill_(1.0)
    return model.eval().requires_grad_(False)


@torch.inference_mode()
def call_kernels(model, context: int = 16) -> int:
    """The kernels of ``model``'s call on one position after ``context`` tokens, as the engine's GPU path makes it
    (`specbook.graphs.StaticModel`, whose forward is the package's decoder where it serves the model)."""
    runner = graphs.StaticModel(model, STATIC_BLOCK)
    runner.start()
    tokens = torch.zeros((1, context + 1), dtype=torch.long, device=model.device)
    runner(tokens[:, :context], keep=1)
    runner(tokens[:, context:])  # allocations and captures on first use are not the call's
    rollback(runner.cache, 1)
    return count_kernels(runner, tokens[:, context:])


def _describe(name: str, model) -> dict:
    config = model.config
    return {"name": name, "forward": forward_name(model), "kernels_per_call": call_kernels(model),
            "parameters": sum(p.numel() for p in model.parameters()), "weight_bytes": weight_bytes(model),
            "layers": config.num_hidden_layers, "hidden_size": config.hidden_size,
            "intermediate_size": config.intermediate_size, "heads": config.num_attention_heads,
            "kv_heads": config.num_key_value_heads, "head_dim": config.head_dim, "vocab_size": config.vocab_size}


@torch.inference_mode()
def call_times(models: dict, positions: dict, context: int = 128, repeats: int = 10, compile: bool = False,
               seed: int = 0, progress: bool = False) -> dict:
    """Seconds of one call of each model on n new positions after ``context`` tokens, batch one.

    ``models``: {name: model}; ``positions``: {name: the n to time}. Each model decodes as the engine's
    GPU path runs it: a `specbook.graphs.StaticModel` (a static KV cache sized in the engine's blocks,
    each call on n positions one replayed CUDA graph on a GPU, compiled kernels with ``compile``), its
    cache filled with ``context`` random tokens by an eager call. Each round then times every (model, n)
    once, in turn, rolling the cache back after each call, so that every call sees the same context
    and the machine in the same state. The first round (two on a GPU: capture, then a replay) is not
    timed. Returns {name: {n: [seconds of each round]}}.
    """
    runners, times = {}, {}
    generator = torch.Generator().manual_seed(seed)
    for name, model in models.items():
        widest = max(positions[name])
        length = min(-(-(context + widest) // STATIC_BLOCK) * STATIC_BLOCK, model.config.max_position_embeddings)
        tokens = torch.randint(model.config.vocab_size, (1, context + widest), generator=generator)
        tokens = tokens.to(model.device)  # (1, context + widest)
        runner = graphs.StaticModel(model, length, compile)
        runner.start()
        runner(tokens[:, :context], keep=1)  # the context: a generation's first call
        runners[name] = runner, tokens
        times[name] = {n: [] for n in positions[name]}
    warmup = 2 if any(model.device.type == "cuda" for model in models.values()) else 1
    for round_ in tqdm(range(warmup + repeats), desc="rounds", disable=not progress, leave=False):
        for name, (runner, tokens) in runners.items():
            for n in positions[name]:
                started = _clock()
                runner(tokens[:, context: context + n])  # logits (n, vocab)
                seconds = _clock() - started
                rollback(runner.cache, n)
                if round_ >= warmup:
                    times[name][n].append(seconds)
    return times


def _summary(seconds: list[float]) -> dict:
    """Milliseconds: the median, min and max of a call's rounds."""
    return {"median": 1000 * statistics.median(seconds), "min": 1000 * min(seconds), "max": 1000 * max(seconds)}


def predictions(cost_ratio: float, verify_ratio: list[float], alphas=ALPHAS) -> tuple[list[dict], list[dict]]:
    """Predicted speedups from measured costs: one row per (alpha, K) for K = 1 .. len(verify_ratio) - 1,
    and the best K per alpha (ties to the smaller K).

    ``verify_ratio`` [v(1), ..., v(K_max + 1)]. ``speedup`` is `specbook.theory.batch_speedup` with
    c = ``cost_ratio`` and r = v(K + 1); ``speedup_free_verification`` is Theorem 3.8 as written
    (`specbook.theory.speedup`, a target call that costs the same on K + 1 positions as on one).
    """
    rows = [{"alpha": alpha, "k": k, "tokens_per_call": expected_tokens_per_step(alpha, k),
             "verify_ratio": verify_ratio[k], "speedup": batch_speedup(alpha, k, cost_ratio, verify_ratio[k]),
             "speedup_free_verification": speedup(alpha, k, cost_ratio)}
            for alpha in alphas for k in range(1, len(verify_ratio))]
    best = []
    for alpha in alphas:
        fastest = max((row for row in rows if row["alpha"] == alpha), key=lambda row: (row["speedup"], -row["k"]))
        best.append({"alpha": alpha, "k": fastest["k"], "speedup": fastest["speedup"]})
    return rows, best


def _release(models: dict) -> None:
    """Free the memory of ``models`` ({role: model}, emptied): the next pair may need all of it. Drops their
    compiled forwards (`specbook.graphs.compiled` memoises one per model), then the last references."""
    for model in models.values():
        if graphs._COMPILED.pop(model, None) is not None:
            torch._dynamo.reset()  # compiled code holds the weights too
    models.clear()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def probe_pair(pair: str, scale: int = 1, k_max: int = 6, repeats: int = 10, context: int = 128, device="cpu",
               dtype=None, compile: bool = False, seed: int = 0, copy_gb_s: float | None = None,
               progress: bool = False) -> dict:
    """The cost probe for one pair (module docstring): its models, the calls' times, c, v, the bandwidth
    and the predictions. ``copy_gb_s``: the device's copy bandwidth (measured when not given)."""
    _check_options([pair], scale, k_max, repeats, context)
    device = torch.device(device)
    dtype = dtype if dtype is not None else default_dtype(device)
    names = dict(zip(("target", "draft"), PAIRS[pair]))
    configs = {role: scaled_config(name, scale) for role, name in names.items()}
    _check_memory(configs.values(), device, dtype, f"{pair} pair at scale {scale}")
    models = {role: build_model(config, device, dtype, seed + i) for i, (role, config) in enumerate(configs.items())}
    try:
        positions = {"target": list(range(1, k_max + 2)), "draft": [1]}
        times = call_times(models, positions, context, repeats, compile, seed, progress)
        target_ms = [_summary(times["target"][n]) for n in positions["target"]]  # n = 1 .. K_max + 1
        draft_ms = _summary(times["draft"][1])
        one = target_ms[0]["median"]
        cost_ratio = draft_ms["median"] / one
        verify_ratio = [calls["median"] / one for calls in target_ms]  # v(1) = 1, ..., v(K_max + 1)
        described = {role: _describe(names[role], model) for role, model in models.items()}
    finally:
        _release(models)
    rows, best = predictions(cost_ratio, verify_ratio)
    copy_gb_s = copy_gb_s if copy_gb_s is not None else copy_bandwidth(device)
    achieved = described["target"]["weight_bytes"] / (one / 1000) / 1e9  # GB/s
    return {"pair": pair, **described, "target_ms": {key: [calls[key] for calls in target_ms] for key in target_ms[0]},
            "draft_ms": draft_ms, "cost_ratio": cost_ratio, "verify_ratio": verify_ratio,
            "bandwidth_gb_s": achieved, "copy_bandwidth_gb_s": copy_gb_s, "bandwidth_fraction": achieved / copy_gb_s,
            "predictions": rows, "best_k": best}


def cost_probe(pairs=None, scale: int = 1, k_max: int = 6, repeats: int = 10, context: int = 128, device="cpu",
               dtype=None, compile: bool = False, seed: int = 0, progress: bool = True) -> dict:
    """The cost probe for each of ``pairs`` (names in `PAIRS`, default all), one pair on the device at a time.

    ``k_max``: the largest draft length K (the target is timed on 1 .. K + 1 positions). ``repeats``:
    timed rounds. ``context``: tokens in the cache before the timed calls. ``dtype``: default
    `specbook.models.default_dtype` of ``device``. ``compile``: Inductor's kernels inside the calls (a
    compilation per input length, minutes for a real model; by default the engine's default, the
    models' own kernels, replayed as CUDA graphs on a GPU).
    Returns the settings, the machine and library versions (`specbook.gpu.environment`), and one entry
    per pair (`probe_pair`); `specbook.gpu.write_results` stores it as JSON, `report` prints it.
    """
    pairs = list(PAIRS) if pairs is None else [pairs] if isinstance(pairs, str) else list(pairs)
    if not pairs:
        raise ValueError(f"pairs must name at least one of {tuple(PAIRS)}")
    _check_options(pairs, scale, k_max, repeats, context)
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device must be one this machine has: {device} is not available (try device='cpu')")
    dtype = dtype if dtype is not None else default_dtype(device)
    bandwidth = copy_bandwidth(device)
    results = [probe_pair(pair, scale, k_max, repeats, context, device, dtype, compile, seed, bandwidth, progress)
               for pair in tqdm(pairs, desc="pairs", disable=not progress)]
    settings = {"scale": scale, "k_max": k_max, "repeats": repeats, "context": context,
                "dtype": str(dtype).removeprefix("torch."), "cache": "static", "cuda_graphs": device.type == "cuda",
                "compile": compile, "batch_size": 1, "alphas": list(ALPHAS)}
    return {**environment(), "settings": settings, "copy_bandwidth_gb_s": bandwidth, "pairs": results}


def report(results: dict) -> str:
    """The probe's results as text: per pair, its costs, then a table of predicted speedups (a row per K,
    a column per alpha, with v(K + 1)) and the best K per alpha."""
    import pandas as pd

    settings = results["settings"]
    size = "full size" if settings["scale"] == 1 else f"widths / {settings['scale']}"
    calls = ("CUDA graphs" if settings["cuda_graphs"] else "eager") + (", compiled" if settings["compile"] else "")
    lines = [f"cost probe on {results['device']} ({size}, {settings['dtype']}, static cache, {calls}, "
             f"{settings['context']} tokens of context, "
             f"{settings['repeats']} rounds; torch {results['torch']}, transformers {results['transformers']})"]
    for pair in results["pairs"]:
        target, draft, calls = pair["target"], pair["draft"], pair["target_ms"]
        table = pd.DataFrame(pair["predictions"]).pivot_table(index="k", columns="alpha", values="speedup")
        table.columns = [f"alpha={alpha:g}" for alpha in table.columns]
        table.insert(0, "v(K+1)", pair["verify_ratio"][1:])
        table.index.name = "K"
        best = ", ".join(f"alpha {row['alpha']:g}: K={row['k']} ({row['speedup']:.2f}x)" for row in pair["best_k"])
        lines += ["",
                  f"{pair['pair']}: target {target['name']} ({target['parameters'] / 1e9:.3g} B parameters, "
                  f"{target['weight_bytes'] / 1e9:.3g} GB), draft {draft['name']} "
                  f"({draft['parameters'] / 1e9:.3g} B, {draft['weight_bytes'] / 1e9:.3g} GB)",
                  f"target call on one position {calls['median'][0]:.2f} ms (min {calls['min'][0]:.2f}, max "
                  f"{calls['max'][0]:.2f}); draft step {pair['draft_ms']['median']:.2f} ms (min "
                  f"{pair['draft_ms']['min']:.2f}, max {pair['draft_ms']['max']:.2f}); c = {pair['cost_ratio']:.3f}",
                  *([f"kernels per call on one position: target {target['kernels_per_call']}, draft "
                     f"{draft['kernels_per_call']} ({target['forward']})"] if "kernels_per_call" in target else []),
                  f"target weights read at {pair['bandwidth_gb_s']:.1f} GB/s, {pair['bandwidth_fraction']:.2f} of "
                  f"the copy bandwidth ({pair['copy_bandwidth_gb_s']:.1f} GB/s)",
                  "predicted speedup over autoregressive decoding (Theorem 3.8 with c and v(K+1)):",
                  table.to_string(float_format=lambda x: f"{x:.2f}"),
                  f"best K: {best}"]
    return "\n".join(lines)
