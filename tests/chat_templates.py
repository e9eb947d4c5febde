"""The chat formats of the model families drafterkit claims, for tests: each family's published chat template
(its ``tokenizer_config.json`` ``chat_template``, tool-calling branches included, kept verbatim in
``tests/templates/<family>.jinja``), its special tokens, and its
``generation_config`` EOS tokens, plus :func:`tiny_tokenizer`, a small byte-level BPE tokenizer (vocabulary
<= 512, built here in milliseconds, no Hub) carrying one family's special tokens and template.

The byte-level BPE stands in for each family's own vocabulary (tiktoken BPE for Llama-3, Qwen's BPE,
SentencePiece for Gemma and Mistral): what the tests need from a tokenizer is the family's special tokens as
single ids, a template that renders the family's exact text, and character offsets; the template strings
and token names are the families' own.

    from chat_templates import FAMILIES, tiny_tokenizer, generation_eos_ids
    tok = tiny_tokenizer("gemma2")              # a transformers PreTrainedTokenizerFast
    GenerationConfig(eos_token_id=generation_eos_ids(tok, "gemma2"))

Sources (model cards' tokenizer_config.json / generation_config.json):
- llama3: meta-llama/Llama-3.1-8B-Instruct (also 3.3-70B): eos ids 128001 <|end_of_text|>, 128008 <|eom_id|>,
  128009 <|eot_id|>; an assistant turn ends with <|eot_id|>.
- qwen2.5: Qwen/Qwen2.5-7B-Instruct: ChatML with Qwen's default system prompt; eos 151645 <|im_end|>,
  151643 <|endoftext|>.
- qwen3: Qwen/Qwen3-0.6B (the whole Qwen3 line): ChatML with <think> reasoning blocks, which the template
  strips from assistant turns before the last user turn; <think> / </think> are added tokens that are NOT
  special; eos as Qwen2.5.
- gemma2: google/gemma-2-2b-it: no system role (a system turn raises), roles user / model, contents trimmed;
  eos ids 1 <eos>, 107 <end_of_turn>.
- mistral: mistralai/Mistral-7B-Instruct-v0.3: [INST] / [/INST] control tokens, an assistant turn is
  " " + content|trim + </s>; a system message goes into the LAST user turn only; eos 2 </s>.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

TEMPLATES = Path(__file__).resolve().parent / "templates"  # <family>.jinja: each template as published


def read_template(family: str) -> str:
    """The published chat template of ``family``, byte for byte (``tests/templates/<family>.jinja``)."""
    return (TEMPLATES / f"{family}.jinja").read_text(encoding="utf-8")


@dataclass(frozen=True)
class ChatFamily:
    """One family's chat format.

    Attributes:
        model: the model card the template and token facts come from.
        template: its ``chat_template``. specials: its special tokens (each one id, never split).
        added: added tokens that are NOT special (Qwen3's ``<think>`` / ``</think>``): one id each, but text
            a reply may contain. bos / eos / pad: the tokenizer's bos_token / eos_token / pad_token.
        end_of_turn: the token that closes an assistant turn in the template (and stops generation).
        generation_eos: ``generation_config.eos_token_id`` as tokens, in the card's order.
        system_role: whether the template accepts a system turn where it was given.
    """

    model: str
    template: str
    specials: tuple[str, ...]
    bos: str | None
    eos: str
    pad: str | None
    end_of_turn: str
    generation_eos: tuple[str, ...]
    added: tuple[str, ...] = field(default_factory=tuple)
    system_role: bool = True


FAMILIES: dict[str, ChatFamily] = {
    "llama3": ChatFamily(
        model="meta-llama/Llama-3.1-8B-Instruct", template=read_template("llama3"),
        specials=("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                  "<|eom_id|>", "<|eot_id|>", "<|python_tag|>", "<|finetune_right_pad_id|>"),
        bos="<|begin_of_text|>", eos="<|eot_id|>", pad=None, end_of_turn="<|eot_id|>",
        generation_eos=("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>")),
    "qwen2.5": ChatFamily(
        model="Qwen/Qwen2.5-7B-Instruct", template=read_template("qwen2.5"),
        specials=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        added=("<tool_call>", "</tool_call>"),
        bos=None, eos="<|im_end|>", pad="<|endoftext|>", end_of_turn="<|im_end|>",
        generation_eos=("<|im_end|>", "<|endoftext|>")),
    "qwen3": ChatFamily(
        model="Qwen/Qwen3-0.6B", template=read_template("qwen3"),
        specials=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        added=("<tool_call>", "</tool_call>", "<think>", "</think>"),
        bos=None, eos="<|im_end|>", pad="<|endoftext|>", end_of_turn="<|im_end|>",
        generation_eos=("<|im_end|>", "<|endoftext|>")),
    "gemma2": ChatFamily(
        model="google/gemma-2-2b-it", template=read_template("gemma2"),
        specials=("<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"),
        bos="<bos>", eos="<eos>", pad="<pad>", end_of_turn="<end_of_turn>",
        generation_eos=("<eos>", "<end_of_turn>"), system_role=False),
    "mistral": ChatFamily(
        model="mistralai/Mistral-7B-Instruct-v0.3", template=read_template("mistral"),
        specials=("<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
                  "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"),
        bos="<s>", eos="</s>", pad=None, end_of_turn="</s>", generation_eos=("</s>",)),
}

# Text the tiny BPE is trained on: enough English, code and punctuation for short, stable tokenizations.
CORPUS = [
    "The capital of France is Paris. It is known for the Eiffel Tower and the Louvre.",
    "What is 2+2? It is 4. And 3*3, in words? Nine. Anything else you would like to know?",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))  # 5",
    "You are a helpful assistant. Answer in one short line, please.",
    "Let me think about this step by step: first the question, then the answer.",
    "Write a haiku about autumn leaves falling on a quiet river at dusk.",
    "Sure! Here is a summary of the article in three sentences, with the key points first.",
]


def tiny_tokenizer(family: str, vocab_size: int = 384):
    """A ``PreTrainedTokenizerFast`` for ``family`` (a key of :data:`FAMILIES`): byte-level BPE trained on
    :data:`CORPUS` (every text encodes, decodes exactly, with character offsets), ids 0.. the family's
    special and added tokens, then the 256 bytes and merges up to ``vocab_size`` (<= 512 for tiny targets).
    Deterministic: the same family gives the same ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    fam = FAMILIES[family]
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(fam.specials) + list(fam.added),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    core.train_from_iterator(CORPUS, trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token=fam.bos, eos_token=fam.eos, pad_token=fam.pad,
                                  unk_token="<unk>" if "<unk>" in fam.specials else None)
    tok.add_special_tokens({"additional_special_tokens": [s for s in fam.specials
                                                          if s not in (fam.bos, fam.eos, fam.pad, "<unk>")]})
    from tokenizers import AddedToken

    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in fam.added])
    tok.chat_template = fam.template
    return tok


def generation_eos_ids(tok, family: str) -> list[int]:
    """``generation_config.eos_token_id`` of ``family`` as ids of ``tok`` (:func:`tiny_tokenizer`)."""
    return [tok.convert_tokens_to_ids(t) for t in FAMILIES[family].generation_eos]
