"""Chat prompts: messages rendered to token ids with the tokenizer's own chat template."""
from __future__ import annotations

from typing import Any

from jinja2 import TemplateError

from .prompts import check_text


def chat_prompt_token_ids(tokenizer, messages: Any, tools: list | None = None) -> list[int]:
    """Render ``[{"role": ..., "content": ...}, ...]`` with a generation prompt appended
    (and ``tools``, for templates that render them).

    Raises ``ValueError`` (naming ``messages``) for anything the template or the
    tokenizer would choke on: a bad shape or role, a lone surrogate in a
    string, or the template's own refusal (e.g. roles that must alternate).
    """
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list of {'role', 'content'} objects")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise ValueError(f"messages[{i}] must be an object with 'role' and 'content'")
        if message["role"] not in ("system", "user", "assistant", "tool", "developer"):
            raise ValueError(f"messages[{i}].role must be system, user, assistant or tool, "
                             f"got {message['role']!r}")
        for key, value in message.items():
            if isinstance(value, str):
                check_text(f"messages[{i}].{key}", value)
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model's tokenizer has no chat template; use a plain prompt instead")
    try:
        ids = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True,
                                            tokenize=True)
    except TemplateError as exc:
        raise ValueError(f"messages: the model's chat template refused them: {exc}") from None
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return list(ids)
