"""Prompt templates: the question and an instruction to answer inside <answer>...</answer>, as a user turn of the
tokenizer's chat template, or as plain text for a base model without one."""

from __future__ import annotations

from typing import Any, Sequence

from .items import TaskItem
from .specs import TaskError

INSTRUCTIONS = {
    "plain": "Reply with only the final answer as <answer>X</answer>.",
    "math": "Think step by step, then give only the final answer as <answer>X</answer>.",
    "mc": "Reply with only the letter of the correct option as <answer>X</answer>.",
}

CHATML_USER = "<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n"
# A base model's prompt (prompt format "plain", model_packages.PROMPT_FORMATS): the question and instruction, then
# "Answer:" for the completion to continue; {bos} is the tokenizer's BOS text when its tokenizer puts one before every
# text by itself (Gemma does; prompts are encoded without special tokens, so the text must carry it).
PLAIN_PROMPT = "{bos}{examples}Question: {content}\nAnswer:"
PLAIN_SOLVED = "Question: {content}\nAnswer: <answer>{answer}</answer>\n\n"  # one solved example before a plain prompt
PLAIN_NEXT_QUESTION = "\nQuestion:"  # where a base model that goes on past its answer starts a question of its own


def user_message(question: str, family: str = "plain") -> str:
    if family not in INSTRUCTIONS:
        raise TaskError(f"unknown prompt template {family!r}; known: {', '.join(sorted(INSTRUCTIONS))}")
    return f"{question}\n{INSTRUCTIONS[family]}"


class PromptFormatter:
    """Renders items as generation prompts: with the tokenizer's chat template (prompt format "chat"), or as
    PLAIN_PROMPT (format "plain", which a base model's table entry declares; a tokenizer without a chat template
    gets it too).

    For ChatML templates (the embedded models, Qwen) the prompt is built by string formatting, which gives the
    same text as `apply_chat_template(..., add_generation_prompt=True)` about 400x faster (measured on the embedded
    tokenizer);
    any other template goes through `apply_chat_template`.
    """

    def __init__(self, tokenizer: Any, template: str = "auto", prompt_format: str = "chat"):
        if template != "auto" and template not in INSTRUCTIONS:
            raise TaskError(f"unknown prompt template {template!r}; known: auto, {', '.join(sorted(INSTRUCTIONS))}")
        if prompt_format not in ("chat", "plain"):
            raise TaskError(f"unknown prompt format {prompt_format!r}; known: chat, plain")
        self.tokenizer = tokenizer
        self.template = template
        self.plain = prompt_format == "plain" or not getattr(tokenizer, "chat_template", None)
        self.chatml = not self.plain and self._is_chatml(tokenizer)
        self.bos = self._own_bos(tokenizer) if self.plain else ""
        # the text after which a completion no longer answers this prompt ("" for chat prompts: the turn ends it)
        self.next_question = PLAIN_NEXT_QUESTION if self.plain else ""

    @staticmethod
    def _own_bos(tokenizer: Any) -> str:
        """The BOS text when the tokenizer starts every encoded text with it by itself, else ""."""
        bos_id = getattr(tokenizer, "bos_token_id", None)
        if bos_id is None:
            return ""
        return tokenizer.bos_token if tokenizer("x")["input_ids"][:1] == [bos_id] else ""

    @staticmethod
    def _is_chatml(tokenizer: Any) -> bool:
        if not getattr(tokenizer, "chat_template", None):
            return False
        probe = "Q?\nsay <answer>X</answer>."
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": probe}], tokenize=False,
                                                 add_generation_prompt=True)
        return rendered == CHATML_USER.format(content=probe)

    def family(self, item: TaskItem) -> str:
        return item.family if self.template == "auto" else self.template

    def __call__(self, item: TaskItem, examples: Sequence[TaskItem] = ()) -> str:
        """`item`'s prompt; `examples` (plain format only): solved items shown before it, each as PLAIN_SOLVED with
        its reference answer (a warm-up's source prompts; runs never use them)."""
        content = user_message(item.question, self.family(item))
        if examples and not self.plain:
            raise TaskError("solved examples go before plain-format prompts only (a chat model's would be turns)")
        if self.plain:
            shown = "".join(PLAIN_SOLVED.format(content=user_message(example.question, self.family(example)),
                                                answer=example.answer) for example in examples)
            return PLAIN_PROMPT.format(bos=self.bos, examples=shown, content=content)
        if self.chatml:
            return CHATML_USER.format(content=content)
        return self.tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                                  add_generation_prompt=True)
