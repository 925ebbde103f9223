"""The exported pair (`specbook.export`) and the parts of `specbook.vllm_runs` that need no vLLM: the folders a
serving engine loads, the speculative configurations, and the refusals (vLLM absent, a port in use, bad
arguments). vLLM itself runs in tests/vllm, in its own environment (``make test-vllm``)."""

import importlib.util
import json
import socket

import pytest
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
