"""The `tiny-llama` generator: a random-weight Llama and a locally trained tokenizer, made on first use.

It exists so that `sparkctl up tiny`, `make up` and the end-to-end tests serve a real model through the
real vLLM on a machine with no GPU and no model hub: nothing is downloaded, everything is seeded, so
two runs write byte-identical files.

Shape choices follow what vLLM's CPU backend accepts: head_dim 64 (16 is rejected by its attention
kernels), float32 weights (served everywhere, with or without AVX512-BF16), a vocabulary small enough
that the whole model is well under 1 MB and loads in a blink.
"""

from __future__ import annotations

import json
from pathlib import Path

# A few dozen lines of plain text: enough for a byte-level BPE to learn real merges, so the token ids
# a chat request produces are a mix of merged words and raw bytes, like a real tokenizer's.
TRAINING_TEXT: tuple[str, ...] = (
    "sparkctl serves a large language model on a DGX Spark with one command.",
    "The Spark has a GB10 GPU, an ARM64 Grace CPU and 128 GB of unified memory.",
    "A recipe names the model, the engine flags and the memory budget.",
    "The planner turns a recipe into a plan: the command line, the environment and the port.",
    "The runtime starts the server, in a container or as a supervised process.",
    "Pre-warming reads the model shards from NVMe with eight parallel readers.",
    "On unified memory the page cache competes with the model for the same bytes.",
    "The server is healthy when /health answers and /v1/models lists the model.",
    "A smoke test sends one chat completion and checks that an answer comes back.",
    "Hello! How can I help you today?",
    "What is the capital of France? The capital of France is Paris.",
    "Write a haiku about the sea. Waves fold into foam, salt wind carries the gull's cry, the tide keeps time.",
    "Explain what a tokenizer does. It splits text into pieces and maps each piece to a number.",
    "Count from one to ten: one, two, three, four, five, six, seven, eight, nine, ten.",
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n    print(i * i)\n",
    "import json\nprint(json.dumps({'ok': True}))\n",
    "The quick brown fox jumps over the lazy dog.",
    "Pack my box with five dozen liquor jugs.",
    "Quantized weights trade a little accuracy for a lot of memory bandwidth.",
    "Decode speed is measured in tokens per second, prefill speed in tokens per second too.",
    "Time to first token is the latency a user feels before the answer starts.",
    "A mixture of experts routes each token to a few experts out of many.",
    "The key-value cache grows with the context length and the number of layers.",
    "system: You are a helpful assistant.",
    "user: Say hello in three languages.",
    "assistant: Hello, bonjour, hola.",
    "user: Thank you!",
    "assistant: You are welcome.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 3.14 2.718 42",
    "Punctuation: . , ; : ! ? ' \" ( ) [ ] { } < > / \\ | - _ + = * & ^ % $ # @ ~ `",
    "Ünïcödé bytes still encode: café, naïve, straße, 東京, 😀.",
)

BOS, EOS, PAD = "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"
TURN_START, TURN_END = "<|start_header|>", "<|eot|>"
SPECIAL_TOKENS: tuple[str, ...] = (BOS, EOS, PAD, TURN_START, TURN_END)
VOCAB_SIZE = 640

# A Jinja chat template in the Llama-3 spirit: each message is a header with the role, the content,
# then an end-of-turn token; `add_generation_prompt` opens the assistant's turn.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '" + TURN_START + "' + message['role'] + '\\n' + message['content'] + '" + TURN_END + "' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '" + TURN_START + "assistant\\n' }}{% endif %}"
)

# The model: hidden 128 = 2 heads x head_dim 64; two layers keep loading and a decode step cheap on CPU.
HIDDEN = 128
HEADS = 2
KV_HEADS = 2
LAYERS = 2
INTERMEDIATE = 256
MAX_POSITIONS = 2048
SEED = 20260
INIT_STD = 0.02


def write_tokenizer(out_dir: Path) -> None:
    """Train a byte-level BPE tokenizer on TRAINING_TEXT and write tokenizer.json + tokenizer_config.json.

    Byte-level so any input string (emoji, other scripts) encodes without an unknown token; trained
    here rather than downloaded because tests and CI never reach a model hub. Other generators (the
    EXL3 checkpoint writer) reuse it so every tiny model speaks the same token ids.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    out_dir.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TRAINING_TEXT, trainer=trainer)
    tok.save(str(out_dir / "tokenizer.json"))

    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": None,
        "add_bos_token": False,  # the chat template writes it
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_POSITIONS,
        "chat_template": CHAT_TEMPLATE,
    }
    _write_json(out_dir / "tokenizer_config.json", config)
    _write_json(
        out_dir / "special_tokens_map.json",
        {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD},
    )


def make_tiny_llama(out_dir: Path) -> None:
    """Write a complete Hugging Face Llama directory: tokenizer, config, random weights, generation config.

    Weights are drawn from a fixed seed so the same bytes come out on every machine; float32 is what
    vLLM's CPU backend serves on any x86-64 or ARM64 host.
    """
    import numpy as np
    from safetensors.numpy import save_file
    from tokenizers import Tokenizer

    out_dir = Path(out_dir)
    write_tokenizer(out_dir)
    tok = Tokenizer.from_file(str(out_dir / "tokenizer.json"))
    vocab = tok.get_vocab_size()
    bos_id, eos_id, pad_id = (tok.token_to_id(t) for t in (BOS, EOS, PAD))
    eot_id = tok.token_to_id(TURN_END)
    head_dim = HIDDEN // HEADS

    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": INIT_STD,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "torch_dtype": "float32",
    }
    _write_json(out_dir / "config.json", config)
    _write_json(
        out_dir / "generation_config.json",
        {"bos_token_id": bos_id, "eos_token_id": [eos_id, eot_id], "pad_token_id": pad_id},
    )

    rng = np.random.default_rng(SEED)

    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * INIT_STD).astype(np.float32)

    q_out = HEADS * head_dim
    kv_out = KV_HEADS * head_dim
    tensors: dict[str, np.ndarray] = {"model.embed_tokens.weight": normal(vocab, HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        tensors[f"{p}.input_layernorm.weight"] = np.ones(HIDDEN, dtype=np.float32)
        tensors[f"{p}.self_attn.q_proj.weight"] = normal(q_out, HIDDEN)
        tensors[f"{p}.self_attn.k_proj.weight"] = normal(kv_out, HIDDEN)
        tensors[f"{p}.self_attn.v_proj.weight"] = normal(kv_out, HIDDEN)
        tensors[f"{p}.self_attn.o_proj.weight"] = normal(HIDDEN, q_out)
        tensors[f"{p}.post_attention_layernorm.weight"] = np.ones(HIDDEN, dtype=np.float32)
        tensors[f"{p}.mlp.gate_proj.weight"] = normal(INTERMEDIATE, HIDDEN)
        tensors[f"{p}.mlp.up_proj.weight"] = normal(INTERMEDIATE, HIDDEN)
        tensors[f"{p}.mlp.down_proj.weight"] = normal(HIDDEN, INTERMEDIATE)
    tensors["model.norm.weight"] = np.ones(HIDDEN, dtype=np.float32)
    tensors["lm_head.weight"] = normal(vocab, HIDDEN)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})


def _write_json(path: Path, data: dict) -> None:
    """Sorted keys and a trailing newline, so regenerated files are byte-identical."""
    path.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
