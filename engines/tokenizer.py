"""Tokenizers and chat templates built from model metadata (never downloaded)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import jinja2
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from engines.errors import ModelError

# The ChatML template the mini models use; SmolLM2's GGUF carries its own (with a system prompt).
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] "
    "+ '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}"
)


def _raise_exception(message: str):
    """A template's own refusal (transformers defines this helper for templates)."""
    raise jinja2.TemplateError(message)


@dataclass
class TextTokenizer:
    """A `tokenizers.Tokenizer` plus the chat template and the ids that end a turn."""

    tok: Tokenizer
    chat_template: str
    eos_ids: tuple[int, ...]
    bos_id: int | None = None
    add_bos: bool = False

    def encode(self, text: str) -> list[int]:
        """Token ids of text, with control tokens written in the text parsed as control tokens."""
        ids = self.tok.encode(text, add_special_tokens=False).ids
        return ([self.bos_id] if self.add_bos and self.bos_id is not None else []) + ids

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=skip_special)

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
        try:
            tmpl = env.from_string(self.chat_template)
            # what transformers' apply_chat_template passes every template (Qwen2.5's asks `if tools`)
            return tmpl.render(messages=messages, add_generation_prompt=add_generation_prompt,
                               bos_token="", eos_token="", tools=None, documents=None,
                               raise_exception=_raise_exception)
        except jinja2.TemplateError as e:
            raise ModelError(f"chat template failed to render: {e}") from None

    def encode_chat(self, user_text: str) -> list[int]:
        return self.encode(self.render_chat([{"role": "user", "content": user_text}]))

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size(with_added_tokens=True)


# Qwen2's pre-tokenizer split (its tokenizer.json; llama.cpp's "qwen2" pre-tokenizer): GPT-4-style words,
# every digit alone, punctuation runs with trailing newlines, whitespace runs.
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")


def _bpe_tokenizer(vocab: dict[str, int], merges: list[tuple[str, str]], specials: list[str],
                   pre: str) -> Tokenizer:
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":  # SmolLM2's "smollm" pre-tokenizer: each digit alone, then GPT-2's regex
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif pre == "qwen2":
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
             pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    return tok


# Gemma's turn format (a Gemma GGUF without a chat template of its own gets this one).
GEMMA_TEMPLATE = (
    "{% for message in messages %}{{'<start_of_turn>' + ('model' if message['role'] == 'assistant' else "
    "message['role']) + '\n' + message['content'] + '<end_of_turn>\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}")


def _spm_bpe_tokenizer(reader) -> TextTokenizer:
    """SentencePiece BPE (tokenizer.ggml.model "llama") for Gemma files, which list no merges.

    Rebuilt as the SentencePiece model works: pieces joined greedily by merge priority, with byte fallback
    (<0xNN> pieces) for what no piece covers, " " written as "▁", no prefix space. The merges are recovered
    from the vocabulary: every split of a piece into two pieces, the pieces taken in file order (Gemma's scores
    do not follow its merge order; transformers' GGUF reader documents the same finding and makes the same
    choice), within a piece the longer left part first. A piece made only of spaces is stored as spaces and
    looked up as "▁"s. Control pieces are special tokens, user-defined ones ("\n\n", ...) matched whole."""
    from tokenizers import AddedToken

    f = reader.fields
    raw = f["tokenizer.ggml.tokens"].contents()
    types = f["tokenizer.ggml.token_type"].contents()
    tokens = ["\u2581" * len(t) if t and not t.strip(" ") else t for t in raw]
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = []
    for piece in tokens:
        splits = [(piece[:k], piece[k:]) for k in range(len(piece) - 1, 0, -1)]
        merges.extend(pair for pair in splits if pair[0] in vocab and pair[1] in vocab)
    unk = tokens[int(f["tokenizer.ggml.unknown_token_id"].contents())] if "tokenizer.ggml.unknown_token_id" in f \
        else "<unk>"
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t, ty in zip(tokens, types) if ty == 3])
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t, ty, r in zip(tokens, types, raw)
                    if ty == 4 and t == r])
    eos = int(f["tokenizer.ggml.eos_token_id"].contents())
    end_turn = vocab.get("<end_of_turn>")
    bos = int(f["tokenizer.ggml.bos_token_id"].contents()) if "tokenizer.ggml.bos_token_id" in f else None
    add_bos = "tokenizer.ggml.add_bos_token" in f and bool(f["tokenizer.ggml.add_bos_token"].contents())
    template = f["tokenizer.chat_template"].contents() if "tokenizer.chat_template" in f else GEMMA_TEMPLATE
    return TextTokenizer(tok, template, eos_ids=(eos,) + ((end_turn,) if end_turn is not None else ()),
                         bos_id=bos, add_bos=add_bos)


def gguf_tokenizer(reader) -> TextTokenizer:
    """From tokenizer.ggml.* metadata: byte-level BPE ("gpt2" model; smollm, qwen2 or default pre-tokenizer),
    or SentencePiece BPE ("llama" model, as Gemma files carry it)."""
    f = reader.fields
    model = f["tokenizer.ggml.model"].contents()
    if model == "llama" and "tokenizer.ggml.merges" not in f:
        return _spm_bpe_tokenizer(reader)
    if model != "gpt2":
        raise ModelError(f"unsupported GGUF tokenizer model {model!r}: 'gpt2' (byte-level BPE) or 'llama' "
                         "(SentencePiece BPE)")
    pre = f["tokenizer.ggml.pre"].contents() if "tokenizer.ggml.pre" in f else "default"
    if pre not in ("smollm", "default", "gpt2", "qwen2"):
        raise ModelError(f"unsupported GGUF pre-tokenizer {pre!r}")
    tokens = f["tokenizer.ggml.tokens"].contents()
    types = f["tokenizer.ggml.token_type"].contents()
    merges = [tuple(m.split(" ", 1)) for m in f["tokenizer.ggml.merges"].contents()]
    vocab = {t: i for i, t in enumerate(tokens)}
    specials = [t for t, ty in zip(tokens, types) if ty == 3]  # 3 = CONTROL
    tok = _bpe_tokenizer(vocab, merges, specials, pre)
    eos = int(f["tokenizer.ggml.eos_token_id"].contents())
    bos = int(f["tokenizer.ggml.bos_token_id"].contents()) if "tokenizer.ggml.bos_token_id" in f else None
    add_bos = "tokenizer.ggml.add_bos_token" in f and bool(f["tokenizer.ggml.add_bos_token"].contents())
    template = f["tokenizer.chat_template"].contents() if "tokenizer.chat_template" in f else CHATML_TEMPLATE
    return TextTokenizer(tok, template, eos_ids=(eos,), bos_id=bos, add_bos=add_bos)


MINI_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def byte_tokenizer() -> TextTokenizer:
    """The mini models' tokenizer: 3 control tokens then the 256 bytes (ids 3..258), no merges."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), key=lambda ch: _byte_of(ch))
    vocab = {s: i for i, s in enumerate(MINI_SPECIALS)}
    vocab.update({ch: 3 + i for i, ch in enumerate(alphabet)})
    tok = _bpe_tokenizer(vocab, [], MINI_SPECIALS, "default")
    return TextTokenizer(tok, CHATML_TEMPLATE, eos_ids=(2,), bos_id=None, add_bos=False)


def _byte_of(ch: str) -> int:
    """GPT-2's byte-to-unicode map, inverted: the byte a ByteLevel alphabet character stands for."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(map(chr, cs), bs))[ch]


def hf_tokenizer(directory: Path) -> TextTokenizer:
    """tokenizer.json (+ tokenizer_config.json for the chat template and EOS) from a checkpoint dir."""
    tj = directory / "tokenizer.json"
    if not tj.is_file():
        raise ModelError(f"checkpoint {directory} has no tokenizer.json: pass token ids instead")
    tok = Tokenizer.from_file(str(tj))
    cfg_path = directory / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
    template = cfg.get("chat_template") or CHATML_TEMPLATE
    eos_tok = cfg.get("eos_token")
    if isinstance(eos_tok, dict):
        eos_tok = eos_tok.get("content")
    eos_id = tok.token_to_id(eos_tok) if eos_tok else None
    return TextTokenizer(tok, template, eos_ids=(eos_id,) if eos_id is not None else ())


__all__ = ["TextTokenizer", "gguf_tokenizer", "byte_tokenizer", "hf_tokenizer"]
