"""Chat prompts: messages rendered to token ids with the tokenizer's own chat template."""
from __future__ import annotations

from typing import Any


def chat_prompt_token_ids(tokenizer, messages: Any) -> list[int]:
    """Render ``[{"role": ..., "content": ...}, ...]`` with a generation prompt appended."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list of {'role', 'content'} objects")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise ValueError(f"messages[{i}] must be an object with 'role' and 'content'")
        if message["role"] not in ("system", "user", "assistant", "tool", "developer"):
            raise ValueError(f"messages[{i}].role must be system, user, assistant or tool, "
                             f"got {message['role']!r}")
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model's tokenizer has no chat template; use a plain prompt instead")
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return list(ids)
