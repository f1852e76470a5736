#!/usr/bin/env python3
"""Write a tiny, weight-less Hugging Face model directory for vLLM tests.

    python tiny_model.py OUT_DIR --shape llama|deepseek_v3

Uses only the standard library and `tokenizers`.  Output is deterministic
(byte-identical on re-run) and takes well under a second.  Serve it with
`vllm serve OUT_DIR --load-format dummy ...`: vLLM fills the weights with
random values, so no *.safetensors file is written or needed.

Files written:
  config.json             architecture + every field vLLM reads for the shape
  generation_config.json  eos/pad ids (vLLM reads it for default stop tokens)
  tokenizer.json          byte-level BPE trained on a fixed corpus (1024 ids)
  tokenizer_config.json   PreTrainedTokenizerFast, ChatML chat_template
                          (with a Hermes-style tools section), eos <|im_end|>
  special_tokens_map.json
"""

import argparse
import json
import os
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

VOCAB_SIZE = 1024
MAX_POS = 512
SPECIAL_TOKENS = [
    "<|endoftext|>",  # 0  pad
    "<|im_start|>",  # 1
    "<|im_end|>",  # 2  eos
    "<tool_call>",  # 3  hermes tool-call tags
    "</tool_call>",  # 4
]
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2

# ChatML; with `tools`, a Hermes/Qwen2.5-style system block, so that
# `--tool-call-parser hermes` matches what the template asks for.
CHAT_TEMPLATE = r"""{%- set has_sys = messages and messages[0].role == 'system' -%}
{%- if tools -%}
{{- '<|im_start|>system\n' -}}
{%- if has_sys -%}{{- messages[0].content ~ '\n\n' -}}{%- endif -%}
{{- '# Tools\n<tools>' -}}
{%- for tool in tools -%}{{- '\n' ~ (tool | tojson) -}}{%- endfor -%}
{{- '\n</tools>\nCall a function as <tool_call>{"name": NAME, "arguments": ARGS}</tool_call><|im_end|>\n' -}}
{%- elif has_sys -%}
{{- '<|im_start|>system\n' ~ messages[0].content ~ '<|im_end|>\n' -}}
{%- endif -%}
{%- for m in messages -%}
{%- if not (loop.first and has_sys) -%}
{%- if m.role == 'tool' -%}
{{- '<|im_start|>user\n<tool_response>\n' ~ m.content ~ '\n</tool_response><|im_end|>\n' -}}
{%- else -%}
{{- '<|im_start|>' ~ m.role ~ '\n' -}}
{%- if m.content is string -%}{{- m.content -}}{%- endif -%}
{%- if m.tool_calls -%}
{%- for tc in m.tool_calls -%}
{%- set f = tc.function if tc.function is defined else tc -%}
{%- set a = f.arguments if f.arguments is string else (f.arguments | tojson) -%}
{{- '\n<tool_call>{"name": "' ~ f.name ~ '", "arguments": ' ~ a ~ '}</tool_call>' -}}
{%- endfor -%}
{%- endif -%}
{{- '<|im_end|>\n' -}}
{%- endif -%}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}"""

_SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "hpcserve renders Slurm job scripts that start language model engines.",
    "A tensor parallel group splits every layer across ranks.",
    "Data parallel replicas each hold a full copy of the model.",
    "What is the weather like in Paris today?",
    "Hello! How can I help you with your cluster job?",
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
    "0 1 2 3 4 5 6 7 8 9 10 100 1000 2048 4096 65536",
]


def _corpus():
    # Fixed text only; a few variations give the trainer enough pairs to reach
    # VOCAB_SIZE merges.  No randomness: training is deterministic.
    for s in _SENTENCES:
        yield s
    for i, a in enumerate(_SENTENCES):
        for j, b in enumerate(_SENTENCES):
            yield f"{a} {b} {i * j}"
            yield f"{a.lower()} {b.upper()}"
    # made-up words from fixed syllables, so the merges fill the vocabulary
    syl = ["ka", "lo", "mi", "ne", "ru", "ta", "shi", "vo", "pe", "zu", "gra", "sto"]
    for a in syl:
        yield " ".join(a + b + c for b in syl for c in syl)


def build_tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    for i, t in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(t) == i, (t, tok.token_to_id(t))
    assert tok.get_vocab_size() <= VOCAB_SIZE
    return tok


def llama_config():
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "hidden_act": "silu",
        "vocab_size": VOCAB_SIZE,
        "max_position_embeddings": MAX_POS,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
        "torch_dtype": "bfloat16",
        "use_cache": True,
    }


def deepseek_v3_config():
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "hidden_size": 256,
        "intermediate_size": 512,  # dense MLP (layer 0)
        "moe_intermediate_size": 128,  # per expert
        "num_hidden_layers": 2,
        "first_k_dense_replace": 1,  # layer 0 dense, layer 1 MoE
        "moe_layer_freq": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        # MLA: the CPU MLA kernel needs kv_lora_rank 512 and rope dim 64
        "q_lora_rank": 128,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 64,
        "qk_rope_head_dim": 64,
        "v_head_dim": 64,
        # MoE
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "n_shared_experts": 1,
        "n_group": 1,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "hidden_act": "silu",
        "vocab_size": VOCAB_SIZE,
        "max_position_embeddings": MAX_POS,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
        "torch_dtype": "bfloat16",
        "use_cache": True,
    }


SHAPES = {"llama": llama_config, "deepseek_v3": deepseek_v3_config}


def _dump(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True, ensure_ascii=False)
        f.write("\n")


def write_model(out_dir, shape):
    os.makedirs(out_dir, exist_ok=True)
    _dump(os.path.join(out_dir, "config.json"), SHAPES[shape]())
    _dump(
        os.path.join(out_dir, "generation_config.json"),
        {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID},
    )
    tok = build_tokenizer()
    tok.save(os.path.join(out_dir, "tokenizer.json"), pretty=False)
    added = {
        str(i): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for i, t in enumerate(SPECIAL_TOKENS)
    }
    _dump(
        os.path.join(out_dir, "tokenizer_config.json"),
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "added_tokens_decoder": added,
            "bos_token": None,
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "unk_token": None,
            "add_bos_token": False,
            "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": MAX_POS,
            "chat_template": CHAT_TEMPLATE,
        },
    )
    _dump(
        os.path.join(out_dir, "special_tokens_map.json"),
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    )


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir")
    p.add_argument("--shape", choices=sorted(SHAPES), default="llama")
    a = p.parse_args(argv)
    write_model(a.out_dir, a.shape)
    return 0


if __name__ == "__main__":
    sys.exit(main())
