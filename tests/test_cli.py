import pandas as pd
import pytest
import torch

from specbook.cli import CHAT_HELP, chat, main
from specbook.models import assets_dir


def test_generate_prints_the_text_and_stats(capsys):
    main(["generate", "ROMEO:\n", "--max-new-tokens", "12", "--k", "3"])
    out, err = capsys.readouterr()
    assert out.startswith("ROMEO:") is False and len(out.strip()) > 0
    assert "target calls" in err and "tokens per call" in err


def test_generate_trace_uses_colours(capsys):
    main(["generate", "ROMEO:\n", "--max-new-tokens", "12", "--trace"])
    assert "\033[" in capsys.readouterr().out


def test_leaves_torch_as_it_found_it(capsys):
    import torch

    main(["generate", "ROMEO:\n", "--max-new-tokens", "4"])
    assert torch.is_grad_enabled()


def test_greedy_ar_and_speculative_print_the_same_text(capsys):
    main(["generate", "JULIET:\n", "--max-new-tokens", "16", "--method", "ar"])
    ar = capsys.readouterr().out
    main(["generate", "JULIET:\n", "--max-new-tokens", "16", "--method", "spec", "--k", "5"])
    assert capsys.readouterr().out == ar


def test_bad_arguments_exit_with_a_message(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "ROMEO:\n", "--k", "0"])
    assert "must be an integer >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["generate", "ROMEO:\n", "--top-p", "1.5"])
    assert "top_p" in capsys.readouterr().err


HEADS_TRAINED = all((assets_dir() / kind / "config.json").exists() for kind in ("medusa", "eagle"))


@pytest.mark.parametrize("suite, rows", [
    ("comparison", 5), ("ablation", 7),
    pytest.param("heads", 9, marks=pytest.mark.skipif(not HEADS_TRAINED, reason="the built-in heads are not trained"))])
def test_bench_writes_a_csv(tmp_path, capsys, monkeypatch, suite, rows):
    monkeypatch.setenv("SPECBOOK_QUICK_TIMING", "1")  # one round on one prompt: the rows, not their times
    out = tmp_path / "bench.csv"
    main(["bench", "--suite", suite, "--prompts", "open", "--ks", "1,2", "--max-new-tokens", "8", "--repeats", "1",
          "--out", str(out)])
    table = pd.read_csv(out)
    assert len(table) == rows and table["same_tokens"].all()
    assert {"method", "speedup", "tokens_per_call", "acceptance_rate", "machine", "prompts"} <= set(table.columns)
    assert (table["seconds_min"] <= table["seconds"]).all() and (table["seconds"] <= table["seconds_max"]).all()
    assert (table["speedup_min"] <= table["speedup"]).all() and (table["speedup"] <= table["speedup_max"]).all()
    out = capsys.readouterr().out
    assert (table["bandwidth_gb_s"] > 0).all() and "copy bandwidth is" in out and "1.00x (1.00-1.00)" in out
    assert not table["packed_target"].any() and (table["target_forward"] == "specbook.decoder").all()


def _on_the_gpu_path(suite, tmp_path, monkeypatch, max_new_tokens):
    """``bench --suite SUITE --gpu-path`` on the repetitive prompts, quickly: its results file."""
    import json

    from specbook import graphs

    monkeypatch.setenv("SPECBOOK_QUICK_TIMING", "1")
    monkeypatch.setattr(graphs, "CAPTURE_ON_CPU", False)  # restored after: the command sets it
    out = tmp_path / f"{suite}.json"
    main(["bench", "--suite", suite, "--gpu-path", "--categories", "repetitive", "--max-new-tokens",
          str(max_new_tokens), "--repeats", "1", "--json", str(out)])
    assert graphs.CAPTURE_ON_CPU
    return json.loads(out.read_text())


def test_the_family_suite_runs_every_method_on_the_gpu_path(tmp_path, monkeypatch):
    """--gpu-path: every row on the static cache with the graphs' CPU stand-in, trees included (issue of trees
    stopping mid-generation there); the suite itself stops on a greedy row that differs."""
    results = _on_the_gpu_path("family", tmp_path, monkeypatch, 12)
    assert results["gpu_path"]
    greedy = [row for row in results["rows"] if row["sampling"] == "greedy"]
    assert len(greedy) == 21 + 2 and all(row["same_tokens"] for row in greedy)


def test_the_gpu_suite_writes_a_results_file(tmp_path, capsys, monkeypatch):
    """On a CPU its ratios mean nothing; the command's wiring and the file are checked (timed quickly)."""
    import json

    monkeypatch.setenv("SPECBOOK_QUICK_TIMING", "1")  # one round on one prompt: `specbook.bench.run_benchmark`
    out = tmp_path / "gpu.json"
    main(["bench", "--suite", "gpu", "--ks", "2", "--max-new-tokens", "6", "--repeats", "1", "--no-compile",
          "--json", str(out)])
    results = json.loads(out.read_text())
    assert set(results["best"]) == {"greedy", "temperature 1"} and results["models"]["pair"] == "shakespeare"
    assert "best k=2" in capsys.readouterr().out


def test_the_profile_suite_splits_a_step_for_each_k(capsys):
    main(["bench", "--suite", "profile", "--prompts", "open", "--ks", "1,3", "--max-new-tokens", "6"])
    out = capsys.readouterr().out
    assert "milliseconds per step" in out and "target call" in out and "engine" in out and "at_most" in out
    assert len(out.strip().splitlines()) == 5  # a title, the header, one row per K, what at_most means
    main(["bench", "--suite", "profile", "--prompts", "open", "--ks", "1", "--max-new-tokens", "6", "--no-pack"])
    assert "linear layers as loaded" in capsys.readouterr().out


def test_the_family_suite_writes_one_row_per_method_category_and_sampling(tmp_path, capsys, monkeypatch):
    import json

    monkeypatch.setenv("SPECBOOK_QUICK_TIMING", "1")  # one round on one prompt: the rows, not their times
    out = tmp_path / "family.json"
    main(["bench", "--suite", "family", "--categories", "repetitive", "--max-new-tokens", "5", "--repeats", "1",
          "--json", str(out)])
    results = json.loads(out.read_text())
    rows = results["rows"]
    assert results["k"] == 4 and {row["k"] for row in rows if row["method"] == "draft model, chain"} == {4}  # the book's K
    # AR and 20 methods greedy (blockwise, EAGLE-3's two and PARD's chain among them), 19 sampled; the MTP model and
    # its heads
    assert len(rows) == 21 + 20 + 2 * 2
    assert {"EAGLE-3, chain", "EAGLE-3, dynamic 16-node tree", "PARD, chain"} <= {row["method"] for row in rows}
    assert {row["method"] for row in rows if row["sampling"] == "greedy"} - \
        {row["method"] for row in rows if row["sampling"] == "sampled"} == {"blockwise, blocks of 5"}
    assert {"method", "category", "sampling", "tokens_per_call", "speedup_vs_ar", "same_tokens",
            "acceptance_rate", "positions_per_call"} <= set(rows[0])
    assert all(row["same_tokens"] for row in rows if row["sampling"] == "greedy")  # checked by the suite too
    assert all(row["same_tokens"] is None for row in rows if row["sampling"] == "sampled")
    assert any(row["positions_per_call"] > 5 for row in rows if row["method"].startswith("lookahead"))  # its window
    assert "speedup over autoregressive decoding" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["bench", "--suite", "family", "--categories", "open,poetry"])
    assert "unknown ['poetry']" in capsys.readouterr().err


def test_the_heads_suite_refuses_another_pair(capsys):
    """The heads were trained on the built-in target: refused before anything is loaded (no download)."""
    with pytest.raises(SystemExit):
        main(["bench", "--suite", "heads", "--target", "org/big", "--draft", "org/small"])
    assert "--suite heads needs a built-in pair" in capsys.readouterr().err


def test_chat_switches_settings_and_generates(capsys):
    lines = iter(["/help", "/k 2", "/method ar", "/length 5", "/top_p off", "/k zero", "ROMEO:\\n", "/quit"])

    class Args:
        pair = target = draft = device = dtype = None
        temperature, top_k, top_p, max_new_tokens, seed = 0.0, None, None, 8, 0

    chat(Args(), input_fn=lambda prompt: next(lines))
    out = capsys.readouterr().out
    assert CHAT_HELP in out
    assert "'k': 2" in out and "'method': 'ar'" in out and "'length': 5" in out
    assert "error:" in out  # /k zero


def test_hugging_face_assisted_drafts_exactly_k():
    """HF reads the draft length from the assistant's config: k must reach it (counted with a hook)."""
    from specbook import Sampler, load_pair
    from specbook.bench import hugging_face_assisted

    pair = load_pair("shakespeare")
    widths = []
    hook = pair.target.register_forward_hook(lambda module, args, kwargs, out: widths.append(kwargs["input_ids"].shape[1])
                                             if "input_ids" in kwargs else None, with_kwargs=True)
    try:
        for k in (2, 5):
            widths.clear()
            hugging_face_assisted(pair.target, pair.draft, Sampler(0), 24, k=k).run(pair.encode("ROMEO:\n"), 0)
            assert max(widths[1:]) == k + 1  # after the prefill, each call scores k drafts plus one
    finally:
        hook.remove()
    assert pair.draft.generation_config.num_assistant_tokens != 5  # restored afterwards


def test_the_seq2seq_suite_races_the_encoder_decoder_pair_and_hugging_face(tmp_path, capsys, monkeypatch):
    import json

    monkeypatch.setenv("SPECBOOK_QUICK_TIMING", "1")  # one round on one passage: the rows, not their times
    out = tmp_path / "seq2seq.json"
    main(["bench", "--suite", "seq2seq", "--ks", "2,4", "--passages", "2", "--repeats", "1", "--json", str(out)])
    results = json.loads(out.read_text())
    rows = results["rows"]
    methods = [row["method"] for row in rows if row["sampling"] == "greedy"]
    assert results["pair"] == "shakespeare-seq2seq" and results["passages"] == 2
    assert methods == ["autoregressive", "draft on the target's encoder, k=2", "draft on the target's encoder, k=4",
                       "draft with its own encoder, k=4", "prompt lookup, k=4", "HF assisted (its schedule)",
                       "HF assisted k=4"]
    assert all(row["same_tokens"] for row in rows if row["sampling"] == "greedy")  # checked by the suite too
    assert all(row["tokens"] < 2 * 64 for row in rows)  # every method stopped at the end of its text
    assert "shakespeare-seq2seq, 2 held-out passages" in capsys.readouterr().out


def test_the_seq2seq_suite_refuses_a_decoder_only_pair(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--suite", "seq2seq", "--pair", "shakespeare"])
    assert "--suite seq2seq needs an encoder-decoder pair" in capsys.readouterr().err


def test_generate_restores_a_passage_with_the_encoder_decoder_pair(capsys):
    main(["generate", "To be, or <mask> to be: that is the question:", "--pair", "shakespeare-seq2seq", "--k", "4"])
    out, err = capsys.readouterr()
    assert out.strip().endswith("<|endoftext|>") and "question" in out and "tokens per call" in err


def test_the_batch_suite_writes_one_row_per_batch_size_and_method(tmp_path, capsys):
    import json

    out = tmp_path / "batch.json"
    main(["bench", "--suite", "batch", "--batch-sizes", "1,3", "--ks", "1,2", "--max-new-tokens", "6", "--repeats", "1",
          "--json", str(out)])
    results = json.loads(out.read_text())
    rows = results["rows"]
    timed = [(row["batch_size"], row["method"]) for row in rows if row.get("speedup_vs_ar") is not None]
    one_at_a_time, batched_loop = "autoregressive, one row at a time", "autoregressive, batched loop"
    assert timed == [(1, "autoregressive"), (1, one_at_a_time), (1, "hf generate"), (1, batched_loop),
                     (1, "speculative k=1"), (1, "speculative k=2"), (1, "batch-size policy"),
                     (1, "batch-of-one loop, k=2"), (3, "autoregressive"), (3, one_at_a_time), (3, "hf generate"),
                     (3, "speculative k=1"), (3, "speculative k=2"), (3, "batch-size policy"), (1, "measured policy"),
                     (3, "measured policy")]
    assert set(results["measured_policy"]) == {"1", "3"}
    assert results["target_forward"] == results["draft_forward"] == "specbook.decoder"  # batches on the decoder
    assert results["cpu"] and results["project_commit"] and results["transformers"]  # what recorded it
    assert all(row["same_tokens"] for row in rows if row.get("speedup_vs_ar") is not None)
    assert all({"batch_size", "method", "k", "tokens_per_second", "speedup_vs_ar", "tokens_per_call",
                "same_tokens"} <= set(row) for row in rows)
    assert [row["refused"] for row in rows if row["method"] == "hf assisted"] == [
        "assisted generate is only supported for batch_size = 1"]
    assert set(results["costs"]) == set(results["hugging_face_costs"]) == {"1", "3"} and results["policy"]["1"] in (0, 1, 2)
    assert results["crossover"]["predicted_hugging_face"] in (None, 1, 3)
    for row in rows:  # every timed row carries the spread of its rounds, in order
        if row.get("speedup_vs_ar") is not None:
            assert row["seconds_min"] <= row["seconds"] <= row["seconds_max"]
            assert row["speedup_vs_ar_min"] <= row["speedup_vs_ar"] <= row["speedup_vs_ar_max"]
        else:
            assert row["seconds_min"] is None and row["speedup_vs_ar_max"] is None
    assert set(results["fastest"]) == {"1", "3"} and results["fastest"]["1"]["distinguishable"] is False  # 1 round
    assert "measured_every_round" in results["crossover"]
    from specbook import Sampler, load_pair, speculative_generate
    from specbook.batch_bench import batch_prompts
    from specbook.records import acceptance_rate

    pair = load_pair("shakespeare")  # alpha: accepted over tested, pooled over every row of the largest batch
    ids, mask = pair.encode_batch(batch_prompts(3))
    probe = speculative_generate(pair.target, pair.draft, ids, 6, k=2, sampler=Sampler(0), attention_mask=mask)
    assert (results["alpha_rows"], results["alpha_k"]) == (3, 2)
    assert results["alpha"] == acceptance_rate([step for row in probe for step in row.steps])
    out = capsys.readouterr().out
    assert "speedup over batched autoregressive decoding" in out and "x (" in out and "batch 3: fastest" in out
    assert "(accepted over tested, 3 rows, K = 2)" in out


def test_the_batch_suite_measures_batch_sizes_that_do_not_start_at_one(tmp_path, capsys):
    import json

    out = tmp_path / "batch.json"
    main(["bench", "--suite", "batch", "--batch-sizes", "2", "--ks", "1", "--max-new-tokens", "4", "--repeats", "2",
          "--json", str(out)])
    results = json.loads(out.read_text())
    assert set(results["costs"]) == {"2"} and results["policy"]["1"] == results["policy"]["2"]
    policy = next(row for row in results["rows"] if row["method"] == "batch-size policy")
    assert policy["batch_size"] == 2 and policy["k"] == results["policy"]["2"] and policy["same_tokens"]
    assert policy["speedup_vs_ar_min"] <= policy["speedup_vs_ar"] <= policy["speedup_vs_ar_max"]
    assert "batch 2: fastest" in capsys.readouterr().out


def test_the_eagle3_suite_compares_heads_and_positions(tmp_path, monkeypatch):
    """bench --suite eagle3: EAGLE and EAGLE-3 as chains and dynamic trees, a variant from --eagle3-variants labelled
    by what sets it apart, the reduced vocabulary, and α at each of six draft positions for every head."""
    import json

    from specbook import Eagle3Head, load_pair
    from specbook.models import assets_dir

    monkeypatch.setenv("SPECBOOK_QUICK_TIMING", "1")
    variant = tmp_path / "variants" / "no-test"
    Eagle3Head.from_pretrained("shakespeare", load_pair("shakespeare").target).save(variant)
    record = json.loads((assets_dir() / "eagle3" / "training.json").read_text())
    (variant / "training.json").write_text(json.dumps({**record, "ttt_steps": 1}))
    out = tmp_path / "eagle3.json"
    main(["bench", "--suite", "eagle3", "--categories", "repetitive", "--max-new-tokens", "8", "--repeats", "1",
          "--eagle3-variants", str(tmp_path / "variants"), "--eagle3-vocab", "256", "--json", str(out)])
    results = json.loads(out.read_text())
    methods = {row["method"] for row in results["rows"]}
    assert {"EAGLE, chain", "EAGLE-3, chain", "EAGLE-3, dynamic 16-node tree",
            "EAGLE-3 without training-time test, chain", "EAGLE-3, chain, 256-token draft vocabulary"} <= methods
    assert all(row["same_tokens"] for row in results["rows"] if row["sampling"] == "greedy")
    assert set(results["alpha_by_position"]) == {"EAGLE", "EAGLE-3", "EAGLE-3 without training-time test",
                                                 "EAGLE-3, 256-token draft vocabulary"}
    assert all(len(measured["alpha_by_position"]) == 6 for head in results["alpha_by_position"].values()
               for measured in head.values())
    assert results["heads"]["EAGLE-3 without training-time test"]["ttt_steps"] == 1


def test_the_pard_suite_labels_a_variant_by_its_training(tmp_path, monkeypatch):
    """bench --suite pard: the draft model against PARD, and drafts from --pard-variants labelled by what their
    training.json and config set apart (here: no COD; two layers; rows weighted alike; corpus windows mixed in), with α by position for each
    and its training record."""
    import copy
    import json

    from transformers import LlamaForCausalLM

    from specbook.models import assets_dir, load_model
    from specbook.train.models import grow

    monkeypatch.setenv("SPECBOOK_QUICK_TIMING", "1")
    pard = load_model("shakespeare", "pard")
    config = copy.deepcopy(pard.config)
    config.num_hidden_layers = 2
    record = json.loads((assets_dir() / "pard" / "training.json").read_text())
    for name, model, meta in (("no-cod", pard, {**record, "cod": {**record["cod"], "ratio": 1.0}}),
                              ("two-layers", grow(pard, LlamaForCausalLM(config)), record),
                              ("unweighted", pard, {**record, "reached": False}),
                              ("mixed", pard, {**record, "corpus_windows": 256})):
        model.save_pretrained(tmp_path / "variants" / name)
        (tmp_path / "variants" / name / "training.json").write_text(json.dumps(meta))
    out = tmp_path / "pard.json"
    main(["bench", "--suite", "pard", "--categories", "repetitive", "--max-new-tokens", "8", "--repeats", "1",
          "--pard-variants", str(tmp_path / "variants"), "--json", str(out)])
    results = json.loads(out.read_text())
    methods = {row["method"] for row in results["rows"]}
    assert {"draft model, k=6", "PARD, k=8", "PARD without COD, k=4", "PARD trained on the corpus, k=4",
            "PARD of 2 layers, k=4", "PARD unweighted, k=4", "PARD with 256 corpus windows, k=4"} <= methods
    assert all(row["same_tokens"] for row in results["rows"] if row["sampling"] == "greedy")
    assert {"PARD without COD", "PARD trained on the corpus", "PARD of 2 layers"} <= set(results["alpha_by_position"])
    assert results["training"]["PARD without COD"]["cod"]["ratio"] == 1.0
    assert results["training"]["PARD of 2 layers"]["layers"] == 2 and results["training"]["PARD"]["layers"] == 1


def test_the_trees_suite_times_each_tree_size_on_the_gpu_path(tmp_path, monkeypatch):
    """bench --suite trees --gpu-path: the chain and the dynamic tree at each size, on the static cache with the
    graphs' stand-in, every row the baseline's greedy tokens, with its size and its milliseconds per step."""
    from specbook.suites import TREE_SIZES

    results = _on_the_gpu_path("trees", tmp_path, monkeypatch, 10)
    assert results["gpu_path"] and [row["tree_nodes"] for row in results["rows"]] == [None, None, *TREE_SIZES]
    assert all(row["ms_per_step"] > 0 and row["tokens_per_call"] >= 1 for row in results["rows"])
