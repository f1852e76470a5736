#!/usr/bin/env python3
"""Write a tiny Hugging Face model directory for vLLM tests, weight-less by default.

    python tiny_model.py OUT_DIR --shape llama|deepseek_v3 [--weights]

Uses only the standard library and `tokenizers`.  Output is deterministic
(byte-identical on re-run) and takes well under a second.  Serve it with
`vllm serve OUT_DIR --load-format dummy ...`: vLLM fills the weights with
random values, so no *.safetensors file is written or needed.  With
`--weights` (llama shape only) a real `model.safetensors` is written too, so
that vLLM's default loader reads a checkpoint (and logs that it did).

Files written:
  config.json             architecture + every field vLLM reads for the shape
  generation_config.json  eos/pad ids (vLLM reads it for default stop tokens)
  tokenizer.json          byte-level BPE trained on a fixed corpus (1024 ids)
  tokenizer_config.json   PreTrainedTokenizerFast, ChatML chat_template
                          (with a Hermes-style tools section), eos <|im_end|>
  special_tokens_map.json
  model.safetensors       with --weights: every tensor of the Llama checkpoint
"""

import argparse
import json
import os
import struct
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


def llama_tensors(cfg):
    """(name, shape) of every tensor in a Hugging Face Llama checkpoint of this config, as
    vLLM 0.32.0's loader expects them (vllm/model_executor/models/llama.py: LlamaModel's
    load_weights stacks q/k/v_proj into qkv_proj and gate/up_proj into gate_up_proj; the
    default loader's track_weights_loading fails on any parameter the checkpoint lacks)."""
    h, inter, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    q = cfg["num_attention_heads"] * cfg["head_dim"]
    kv = cfg["num_key_value_heads"] * cfg["head_dim"]
    out = [("model.embed_tokens.weight", (v, h))]
    for i in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{i}."
        out += [(pre + "input_layernorm.weight", (h,)),
                (pre + "self_attn.q_proj.weight", (q, h)),
                (pre + "self_attn.k_proj.weight", (kv, h)),
                (pre + "self_attn.v_proj.weight", (kv, h)),
                (pre + "self_attn.o_proj.weight", (h, q)),
                (pre + "post_attention_layernorm.weight", (h,)),
                (pre + "mlp.gate_proj.weight", (inter, h)),
                (pre + "mlp.up_proj.weight", (inter, h)),
                (pre + "mlp.down_proj.weight", (h, inter))]
    out.append(("model.norm.weight", (h,)))
    if not cfg["tie_word_embeddings"]:
        out.append(("lm_head.weight", (v, h)))
    return out


# safetensors dtype names (https://huggingface.co/docs/safetensors: the format) for the
# config's torch_dtype, and how one float32 value becomes its little-endian bytes
# (bfloat16 is float32's upper half).
def _bf16(x):
    return struct.pack("<H", struct.unpack("<I", struct.pack("<f", x))[0] >> 16)


DTYPES = {"bfloat16": ("BF16", _bf16), "float32": ("F32", lambda x: struct.pack("<f", x))}
# A fixed pattern of small values (17 levels within +-0.05, below 1/sqrt(hidden_size)),
# quadratic in the index so that its period is the prime PERIOD and no two rows of a matrix are
# alike, repeated over each matrix; the norms are 1 (an identity scale).
PERIOD = 4099


def _pattern(encode, offset):
    return b"".join(encode((((j * j + offset) * 7919) % PERIOD % 17 - 8) / 160.0)
                    for j in range(PERIOD))


def _tensor_bytes(name, n, encode, blocks):
    if name.endswith("norm.weight"):
        return encode(1.0) * n
    block = blocks.setdefault(name.rsplit(".", 2)[-2], _pattern(encode, len(blocks)))
    size = len(block) // PERIOD
    return (block * (n // PERIOD + 1))[:n * size]


def write_safetensors(path, cfg):
    """A model.safetensors: an 8-byte little-endian header length, a JSON header of each
    tensor's dtype, shape and data_offsets, then the raw tensors back to back."""
    dtype, encode = DTYPES[cfg["torch_dtype"]]
    header, data, at, blocks = {"__metadata__": {"format": "pt"}}, [], 0, {}
    for name, shape in llama_tensors(cfg):
        n = 1
        for d in shape:
            n *= d
        raw = _tensor_bytes(name, n, encode, blocks)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [at, at + len(raw)]}
        data.append(raw)
        at += len(raw)
    head = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for raw in data:
            f.write(raw)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir")
    p.add_argument("--shape", choices=sorted(SHAPES), default="llama")
    p.add_argument("--weights", action="store_true",
                   help="also write model.safetensors (llama shape only)")
    a = p.parse_args(argv)
    if a.weights and a.shape != "llama":
        p.error("--weights: only the llama shape has a checkpoint writer")
    write_model(a.out_dir, a.shape)
    if a.weights:
        write_safetensors(os.path.join(a.out_dir, "model.safetensors"), SHAPES[a.shape]())
    return 0


if __name__ == "__main__":
    sys.exit(main())
