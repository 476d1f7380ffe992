"""A tiny random Gemma3 sequence classifier with a Gemma3 processor, built offline.

Gemma3's own tokenizer is not on this machine, so the processor's tokenizer is the
default model's (SmolLM2) with Gemma3's three image tokens added and named
(``boi_token``, ``image_token``, ``eoi_token``: what ``Gemma3Processor`` reads). The
image processor is the PIL one (no torchvision), 32 px images in 8 px patches pooled to
4 tokens each, so an image becomes ``\\n\\n<start_of_image>`` + 4 x ``<image_soft_token>``
+ ``<end_of_image>\\n\\n``. Every weight is ``N(0, 0.1)`` from the seed: HF's own init
zeroes Gemma3's image projection, which would make every image score alike.
"""

from __future__ import annotations

from pathlib import Path

import torch

BOI, IMAGE, EOI = "<start_of_image>", "<image_soft_token>", "<end_of_image>"
TOKENS_PER_IMAGE = 4

# ChatML; an image part becomes the processor's placeholder, <start_of_image>.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '" + BOI + "' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}"
    "{% endfor %}"
)


def build_vision_classifier(out: Path, tokenizer_dir: Path, seed: int) -> Path:
    """Write model and processor into ``out``; the weights are a pure function of ``seed``."""
    from transformers import (
        AutoTokenizer,
        Gemma3Config,
        Gemma3ForSequenceClassification,
        Gemma3ImageProcessorPil,
        Gemma3Processor,
    )

    names = {"boi_token": BOI, "image_token": IMAGE, "eoi_token": EOI}
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, extra_special_tokens=names)
    tokenizer.add_special_tokens({"additional_special_tokens": [BOI, IMAGE, EOI]})
    boi, image, eoi = tokenizer.convert_tokens_to_ids([BOI, IMAGE, EOI])
    tokenizer.chat_template = CHAT_TEMPLATE
    config = Gemma3Config(
        text_config=dict(
            vocab_size=len(tokenizer),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=32,
            max_position_embeddings=128,
            sliding_window=64,
            pad_token_id=tokenizer.pad_token_id,
        ),
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=32,
            patch_size=8,
        ),
        mm_tokens_per_image=TOKENS_PER_IMAGE,
        boi_token_index=boi,
        image_token_index=image,
        eoi_token_index=eoi,
        num_labels=1,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Gemma3ForSequenceClassification(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    model.save_pretrained(out, safe_serialization=True)
    images = Gemma3ImageProcessorPil(
        size={"height": 32, "width": 32}, image_mean=[0.5] * 3, image_std=[0.5] * 3
    )
    processor = Gemma3Processor(
        image_processor=images,
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
        image_seq_length=TOKENS_PER_IMAGE,
    )
    processor.save_pretrained(out)
    return out
