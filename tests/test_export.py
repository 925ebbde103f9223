"""The exported pair (`specbook.export`) and the parts of `specbook.vllm_runs` that need no vLLM: the folders a
serving engine loads, the speculative configurations, and the refusals (vLLM absent, a port in use, bad
arguments). vLLM itself runs in tests/vllm, in its own environment (``make test-vllm``)."""

import importlib.util
import json
import socket

import pytest
import torch
from transformers import AutoConfig, AutoTokenizer

from specbook.export import SERVED, export_pair
from specbook.vllm_runs import INSTALL, check_port, first_difference, require_vllm, speculative_config


def test_export_writes_each_model_with_the_tokenizer(tmp_path):
    folders = export_pair(tmp_path / "served")
    assert sorted(folders) == sorted(SERVED)
    for model, folder in folders.items():
        assert AutoConfig.from_pretrained(folder).model_type == "llama"
        assert AutoTokenizer.from_pretrained(folder).encode("ROMEO:")  # the pair's tokenizer, beside the config
        assert (folder / "model.safetensors").is_file()
    pard = json.loads((folders["pard"] / "config.json").read_text())
    assert 0 <= pard["pard_token"] < pard["vocab_size"]  # the mask token vLLM reads for parallel drafting
    again = export_pair(tmp_path / "served", models=["draft"])  # a folder already there is replaced
    assert list(again) == ["draft"]


def test_export_refuses_what_it_cannot_serve(tmp_path):
    with pytest.raises(ValueError, match="encoder-decoder"):
        export_pair(tmp_path, "shakespeare-seq2seq", models=["target"])
    with pytest.raises(ValueError, match="models must name models of 'shakespeare'"):
        export_pair(tmp_path, models=["medusa"])
    with pytest.raises(ValueError, match="name must be a built-in pair"):
        export_pair(tmp_path, name=str(tmp_path / "nowhere"))
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="out must be a folder"):
        export_pair(tmp_path / "file")


def test_speculative_configs(tmp_path):
    folders = {"target": tmp_path / "target", "draft": tmp_path / "draft", "pard": tmp_path / "pard"}
    assert speculative_config("autoregressive", folders) is None
    assert speculative_config("draft", folders, 3) == {"method": "draft_model", "model": str(folders["draft"]),
                                                        "num_speculative_tokens": 3}
    assert speculative_config("pard", folders)["parallel_drafting"] is True
    assert speculative_config("ngram", folders, 2)["num_speculative_tokens"] == 2
    with pytest.raises(ValueError, match="method must be one of"):
        speculative_config("medusa", folders)
    with pytest.raises(ValueError, match="k must be an integer >= 1"):
        speculative_config("draft", folders, 0)
    with pytest.raises(ValueError, match="needs the exported 'pard' model"):
        speculative_config("pard", {"target": folders["target"]})


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_without_vllm_the_error_says_how_to_install_it():
    with pytest.raises(ImportError, match="make vllm-env") as error:
        require_vllm()
    assert str(error.value) == INSTALL


def test_a_port_in_use_is_refused():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        with pytest.raises(ValueError, match=f"port {holder.getsockname()[1]} on 127.0.0.1 is in use"):
            check_port(holder.getsockname()[1])
    with pytest.raises(ValueError, match=r"port must be an integer in \[1024, 65535\]"):
        check_port(80)


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_the_export_command(tmp_path, capsys):
    from specbook.cli import main

    main(["export", "--out", str(tmp_path), "--models", "target,draft"])
    printed = capsys.readouterr().out
    assert f"target: {tmp_path / 'target'}" in printed and "speculative_config" in printed
    with pytest.raises(SystemExit):
        main(["export", "--out", str(tmp_path), "--models", "medusa"])
    assert "models must name models of 'shakespeare'" in capsys.readouterr().err


def test_eagle3_is_written_as_servers_load_it(tmp_path):
    from safetensors.torch import load_file

    folders = export_pair(tmp_path, models=["target", "eagle3"])
    config = json.loads((folders["eagle3"] / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["norm_output"] is True
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 6, 9]
    weights = load_file(folders["eagle3"] / "model.safetensors")
    hidden = config["hidden_size"]
    assert weights["fc.weight"].shape == (hidden, 3 * hidden)  # the three hidden states fused
    assert weights["layers.0.self_attn.q_proj.weight"].shape[1] == 2 * hidden  # [embedding; feature]
    assert {"layers.0.hidden_norm.weight", "layers.0.input_layernorm.weight", "norm.weight"} <= set(weights)
    assert "d2t" not in weights and not any("embed_tokens" in name for name in weights)  # full vocabulary
    assert speculative_config("eagle3", folders, 3) == {"method": "eagle3", "model": str(folders["eagle3"]),
                                                         "num_speculative_tokens": 3}


def test_a_reduced_vocabulary_maps_draft_rows_to_target_ids(tmp_path):
    from safetensors.torch import load_file

    from specbook import Eagle3Head, load_pair
    from specbook.export import write_eagle3
    from specbook.models import assets_dir

    target = load_pair("shakespeare").target
    head = Eagle3Head.from_pretrained("shakespeare", target).with_vocabulary(512)
    head.save(tmp_path / "head")
    write_eagle3(tmp_path / "head", tmp_path / "served", assets_dir() / "target")
    weights = load_file(tmp_path / "served" / "model.safetensors")
    rows = torch.arange(512)
    assert (rows + weights["d2t"]).tolist() == head.vocab.tolist()  # vLLM: target id = row + d2t[row]
    assert weights["t2d"].nonzero().flatten().tolist() == head.vocab.tolist()
    assert weights["lm_head.weight"].shape == (512, head.hidden_size)
    assert json.loads((tmp_path / "served" / "config.json").read_text())["draft_vocab_size"] == 512


def test_a_head_for_another_target_or_of_eagle_layout_is_refused(tmp_path):
    folders = export_pair(tmp_path, models=["target", "draft", "eagle3"])
    with pytest.raises(ValueError, match="exported for another target"):
        speculative_config("eagle3", {**folders, "target": folders["draft"]})
    (tmp_path / "old").mkdir()
    from safetensors.torch import save_file
    config = json.loads((folders["eagle3"] / "config.json").read_text())
    (tmp_path / "old" / "config.json").write_text(json.dumps({"kind": "eagle3", "feature_layers": [2, 6, 9]}))
    save_file({"fuse.weight": torch.zeros(2, 6), "fc.weight": torch.zeros(2, 4)}, tmp_path / "old" / "model.safetensors")
    from specbook.export import write_eagle3
    with pytest.raises(ValueError, match="EAGLE's fc before a stock layer"):
        write_eagle3(tmp_path / "old", tmp_path / "out", folders["target"])
    assert config["specbook_target"]
