"""SmolLM2's tokenizer built from GGUF metadata, and the mini byte tokenizer."""

from __future__ import annotations

import pytest

SAMPLES = [
    "Hello, world! The quick brown fox.",
    "1234567890 and 3.14159, -42",
    "line one\nline two\n\n\ttabbed\t end",
    "café naïve résumé Ångström",
    "日本語のテキストと中文",
    "emoji 😀🚀 mixed",
    "def f(x):\n    return x ** 2  # square\n",
    "<|im_start|>user\nhi<|im_end|>\n",
]


@pytest.mark.slow
@pytest.mark.parametrize("text", SAMPLES)
def test_smollm2_round_trip(smollm2, text):
    tok = smollm2.tokenizer
    assert tok.decode(tok.encode(text)) == text


@pytest.mark.slow
def test_smollm2_digits_split_and_control_tokens(smollm2):
    tok = smollm2.tokenizer
    digits = tok.encode("2024")
    assert len(digits) == 4 and [tok.decode([d]) for d in digits] == list("2024")
    assert tok.encode("<|im_start|>") == [1] and tok.encode("<|im_end|>") == [2]
    assert tok.eos_ids == (2,) and not tok.add_bos
    assert tok.encode("The capital of France is") == [504, 3575, 282, 4649, 314]


@pytest.mark.slow
def test_smollm2_chat_template_matches_template_spec(smollm2):
    """The rendered GGUF template gives the ids of ChatML assembled by hand, default system prompt
    included (the template inserts it when no system message is given)."""
    tok = smollm2.tokenizer
    sys_prompt = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    nl = tok.encode("\n")
    want = ([1] + tok.encode("system\n" + sys_prompt) + [2] + nl
            + [1] + tok.encode("user\nWhat is 2+2?") + [2] + nl
            + [1] + tok.encode("assistant\n"))
    assert tok.encode_chat("What is 2+2?") == want


@pytest.mark.parametrize("text", SAMPLES)
def test_byte_tokenizer_round_trip(text):
    from engines.tokenizer import byte_tokenizer

    tok = byte_tokenizer()
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert all(0 <= i < 259 for i in ids)


def test_byte_tokenizer_layout():
    from engines.tokenizer import byte_tokenizer

    tok = byte_tokenizer()
    assert tok.encode("A") == [3 + ord("A")]
    assert tok.encode("<|im_end|>") == [2]


def test_chat_template_gets_what_transformers_passes_every_template(smollm2):
    """Qwen2.5's template asks `if tools` and may call raise_exception; a template asking for a variable nobody
    defines is still a one-line error."""
    from dataclasses import replace

    from engines.errors import ModelError

    tok = replace(smollm2.tokenizer, chat_template="{% if tools %}T{% endif %}{{ messages[0]['content'] }}")
    assert tok.render_chat([{"role": "user", "content": "hi"}]) == "hi"
    refusing = replace(smollm2.tokenizer, chat_template="{{ raise_exception('no system role') }}")
    with pytest.raises(ModelError, match="no system role"):
        refusing.render_chat([{"role": "user", "content": "hi"}])
    with pytest.raises(ModelError, match="undefined"):
        replace(smollm2.tokenizer, chat_template="{{ nobody_defines_this }}").render_chat([])
