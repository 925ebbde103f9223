"""The GPU benchmark: speculative decoding on the GPU path against autoregressive decoding and Hugging
Face's assisted generation, greedy and sampled, and the results file it writes (``results/gpu.json``,
shown in chapter 4, §4.12). Every ratio comes from one run; the file names the device, its driver and
the library versions.
"""

import datetime
import json
import platform
import subprocess
from pathlib import Path

import torch

from .bench import (_clock, autoregressive, cpu_model, decode_latency, hugging_face_assisted, machine, measure_alpha,
                    project_commit, run_benchmark, speculative, with_hugging_face_forward)
from .decoder import forward_name
from .profile import copy_bandwidth, host_profile
from .sampling import Sampler
from .spread import fastest, speedup_range


def gpu_benchmark(pair, prompts, ks=(1, 2, 3, 4, 5, 6, 8), max_new_tokens=128, repeats=5, temperatures=(0.0, 1.0),
                  compile=False, seed=0, progress=True, hf=True) -> dict:
    """Speculative decoding on the GPU path against autoregressive decoding and Hugging Face, as a results dict.

    For each temperature (0 is greedy), on the same ``prompts`` ((1, T) tensors on the pair's device)
    and in one run: autoregressive decoding on the GPU path (static cache, every decode call a replayed
    CUDA graph, Inductor's kernels inside with ``compile``: the baseline, ``speedup_vs_ar``), the same
    without the GPU path (eager, dynamic cache) and on the GPU path with Hugging Face's forward where the
    package's decoder serves the target (`specbook.decoder`), speculative decoding on the GPU path for each K, and
    Hugging Face's assisted generation
    with its own draft-length schedule and with each fixed K (``hf=False`` leaves it out). ``speedup_vs_hf`` compares a
    speculative row with Hugging Face at the same K; ``best`` the fastest speculative K with
    Hugging Face's fastest row. The pair's α (`measure_alpha`, on ``prompts`` over ``max_new_tokens``) and c (per-token
    latencies on the GPU path) say what was measured, `specbook.profile.host_profile` what the host does
    per call at the greedy best K, and ``settings["warmup_seconds"]`` what the GPU path's first runs
    (capturing every graph, compiling with ``compile``) took. `write_results` stores it as JSON.

    Every median comes with the spread of the rounds (`run_benchmark`): ``ms_per_token_min`` and
    ``_max`` from each prompt's fastest and slowest round, and each speedup's ``_min`` and ``_max``
    the extremes of its per-round ratios (`specbook.bench.speedup_range`). ``best`` ranks only as
    far as the spread allows: ``tied_ks`` lists the other speculative K whose ``speedup_vs_ar``
    ranges overlap the best's, ``distinguishable`` says whether there are none (and more than one
    round), and ``fastest_hf_tied`` does the same for Hugging Face's fastest row
    (`specbook.bench.fastest`).
    """
    path = dict(cache="static", compile=compile)
    target, draft = pair.target, pair.draft
    rows, best, warmup = [], {}, {}
    for temperature in temperatures:
        sampler, sampling = Sampler(temperature), "greedy" if temperature == 0 else f"temperature {temperature:g}"
        eager = autoregressive(target, sampler, max_new_tokens, cache="dynamic")
        eager.name = "autoregressive, eager"
        fast = [autoregressive(target, sampler, max_new_tokens, **path)]
        fast += [speculative(target, draft, k, sampler, max_new_tokens, **path) for k in ks]
        others = [with_hugging_face_forward(fast[0])] if forward_name(target) == "specbook.decoder" else []
        started = _clock()
        for method in fast:  # the first runs capture every graph (and compile): timed on their own
            for input_ids in prompts:
                method.run(input_ids, seed)
        warmup[sampling] = _clock() - started
        for method in others:
            for input_ids in prompts:
                method.run(input_ids, seed)
        methods = [fast[0], eager, *others, *fast[1:]]
        if hf:
            methods += [hugging_face_assisted(target, draft, sampler, max_new_tokens)]
            methods += [hugging_face_assisted(target, draft, sampler, max_new_tokens, k=k) for k in ks]
        measured = run_benchmark(methods, prompts, repeats, seed, progress, warm_every_prompt=True)
        hf_rows = {row["k"]: row for row in measured if row["method"].startswith("HF")}
        fastest_hf, hf_tied, _ = fastest(list(hf_rows.values()), "speedup", repeats) if hf else (None, [], False)

        def against(row, name, other):
            return _versus(other, row, name) if other is not None else dict.fromkeys((name, f"{name}_min",
                                                                                       f"{name}_max"))
        for row in measured:
            speculative_row = row["method"].startswith("speculative")
            against_hf = against(row, "speedup_vs_hf", hf_rows.get(row["k"]) if speculative_row else None)
            rows.append({"sampling": sampling, "method": row["method"], "k": row["k"],
                         "ms_per_token": row["ms_per_token"],
                         "ms_per_token_min": 1000 * row["seconds_min"] / row["tokens"],
                         "ms_per_token_max": 1000 * row["seconds_max"] / row["tokens"],
                         "bandwidth_gb_s": row["bandwidth_gb_s"], "speedup_vs_ar": row["speedup"],
                         "speedup_vs_ar_min": row["speedup_min"], "speedup_vs_ar_max": row["speedup_max"],
                         **against_hf, "tokens_per_call": or_none(row["tokens_per_call"]),
                         "acceptance_rate": or_none(row["acceptance_rate"]),
                         "same_tokens_as_ar": row["same_tokens"]})
        top, tied, distinguishable = fastest([row for row in measured if row["method"].startswith("speculative")],
                                             "speedup", repeats)
        fastest_ar = max((row for row in measured if row["method"].startswith("autoregressive")),
                         key=lambda row: row["speedup"])  # the honest baseline: the fastest the package has
        best[sampling] = {"k": top["k"], "speedup_vs_ar": top["speedup"], "speedup_vs_ar_min": top["speedup_min"],
                          "speedup_vs_ar_max": top["speedup_max"], "tied_ks": [row["k"] for row in tied],
                          "distinguishable": distinguishable, **against(top, "speedup_vs_hf", hf_rows.get(top["k"])),
                          **against(top, "speedup_vs_fastest_hf", fastest_hf),
                          "fastest_ar": fastest_ar["method"], **against(top, "speedup_vs_fastest_ar", fastest_ar),
                          "fastest_hf": fastest_hf["method"] if hf else None,
                          "fastest_hf_tied": [row["method"] for row in hf_tied]}
    latency = {name: decode_latency(model, prompts[0], max_new_tokens, repeats, **path)
               for name, model in (("target", target), ("draft", draft))}
    host = host_profile(target, draft, prompts[0], best["greedy"]["k"] if "greedy" in best else max(ks),
                        max_new_tokens, Sampler(0), seed, **path)
    models = {"pair": pair.name, "alpha": measure_alpha(target, draft, prompts, max_new_tokens, seed),
              "target_forward": forward_name(target), "draft_forward": forward_name(draft),
              "host_profile": host,
              "copy_bandwidth_gb_s": copy_bandwidth(target.device),
              "c": latency["draft"] / latency["target"],
              **{name: _describe(model, latency[name]) for name, model in (("target", target), ("draft", draft))}}
    settings = {"prompts": len(prompts), "max_new_tokens": max_new_tokens, "repeats": repeats, "ks": list(ks),
                "cache": "static", "cuda_graphs": target.device.type == "cuda", "compile": compile, "batch_size": 1,
                "warmup_seconds": warmup}
    return {**environment(), "date": datetime.date.today().isoformat(), "models": models, "settings": settings,
            "best": best, "results": rows}


def _versus(baseline, row, name) -> dict:
    """``row``'s speedup over another `run_benchmark` row of the same run, with its range over the rounds, as
    ``name``, ``name_min`` and ``name_max``."""
    speedup = baseline["seconds"] / row["seconds"]
    low, high = speedup_range(baseline["round_seconds"], row["round_seconds"], speedup)
    return {name: speedup, f"{name}_min": low, f"{name}_max": high}


def or_none(value):
    """NaN (nothing measured: no drafts) as None, which JSON can hold."""
    return None if value != value else value


def _describe(model, seconds_per_token):
    config = model.config
    return {"parameters": sum(p.numel() for p in model.parameters()), "layers": config.num_hidden_layers,
            "hidden_size": config.hidden_size, "dtype": str(model.dtype).removeprefix("torch."),
            "ms_per_token": 1000 * seconds_per_token}


def environment() -> dict:
    """The device, its driver and the library versions, for a results file."""
    import transformers

    found = {"device": machine(), "cpu": cpu_model(), "project_commit": project_commit(), "driver": None,
             "cuda": torch.version.cuda, "torch": torch.__version__, "transformers": transformers.__version__,
             "python": platform.python_version()}
    if torch.cuda.is_available():
        try:
            found["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                             capture_output=True, text=True, check=True).stdout.split()[0]
        except (OSError, subprocess.CalledProcessError, IndexError):
            pass
    return found


def write_results(results: dict, path) -> None:
    """``results`` as JSON at ``path``, with the machine, the CPU, the project's commit and the library versions
    that made them (`environment`) where the results do not say already."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps({**environment(), **results}, indent=1) + "\n")
