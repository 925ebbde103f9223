"""Tiny random causal LMs of the families a reader brings, built from their Hugging Face configs (no download).

Each has 2 layers 32 wide (the draft: 1 layer) over a 96-token vocabulary and runs in milliseconds.
The families with sliding-window attention get a window of 8 positions, far shorter than the
prompts and outputs of the tests, so a window that is ignored or misplaced changes the tokens:
Mistral and Phi-3 slide in every layer, Qwen2 (``use_sliding_window``), Gemma 2 and Gemma 3 mix
sliding and full layers, and Gemma 2 caps its logits with a tanh.
"""

import torch
import transformers

VOCAB, WINDOW = 96, 8


def _config(family: str, vocab: int, layers: int, hidden: int):
    common = dict(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=2,
                  intermediate_size=2 * hidden, max_position_embeddings=256, bos_token_id=None, eos_token_id=None,
                  pad_token_id=None)
    sliding = ["sliding_attention", "full_attention"] * layers
    configs = {
        "llama": lambda: transformers.LlamaConfig(num_key_value_heads=1, **common),
        "qwen2": lambda: transformers.Qwen2Config(num_key_value_heads=1, use_sliding_window=True, sliding_window=WINDOW,
                                                  max_window_layers=1, **common),
        "qwen3": lambda: transformers.Qwen3Config(num_key_value_heads=1, head_dim=16, **common),
        "mistral": lambda: transformers.MistralConfig(num_key_value_heads=1, sliding_window=WINDOW, **common),
        "phi3": lambda: transformers.Phi3Config(num_key_value_heads=2, sliding_window=WINDOW, **common),
        "gemma2": lambda: transformers.Gemma2Config(num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16,
                                                    sliding_window=WINDOW, layer_types=sliding[:layers], **common),
        "gemma3": lambda: transformers.Gemma3TextConfig(num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16,
                                                        sliding_window=WINDOW, layer_types=sliding[:layers], **common),
        "olmo2": lambda: transformers.Olmo2Config(num_key_value_heads=2, **common),
        "gpt2": lambda: transformers.GPT2Config(vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=2,
                                                n_positions=256, bos_token_id=None, eos_token_id=None),
        "opt": lambda: transformers.OPTConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                                              num_attention_heads=2, ffn_dim=2 * hidden, word_embed_proj_dim=hidden,
                                              max_position_embeddings=256, bos_token_id=None, eos_token_id=None,
                                              pad_token_id=None),
        "gpt_neox": lambda: transformers.GPTNeoXConfig(num_key_value_heads=2, **common),
    }
    return configs[family]()


FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "phi3", "gemma2", "gemma3", "olmo2", "gpt2", "opt", "gpt_neox")
SLIDING = ("qwen2", "mistral", "phi3", "gemma2", "gemma3")


def tiny_family_model(family: str, seed: int = 0, layers: int = 2, hidden: int = 32, vocab: int = VOCAB):
    """A random model of ``family`` in eval mode, fp32; its logits sharpened so greedy choices are clear-cut.

    ``vocab`` beyond VOCAB adds embedding rows no token uses, as real models pad their matrices.
    """
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(_config(family, vocab, layers, hidden)).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8)
    model.generation_config.eos_token_id = None  # generate() runs to max_new_tokens, like the engine
    return model


def hf_greedy(model, prompt: torch.Tensor, new_tokens: int) -> list[int]:
    """The model's own ``generate(do_sample=False)``: the reference every method must equal."""
    output = model.generate(prompt, max_new_tokens=new_tokens, do_sample=False,
                            attention_mask=torch.ones_like(prompt), pad_token_id=0)
    return output[0, prompt.shape[1]:].tolist()
