"""The front end: prompts and params in (input processing), text out (detokenizer, stop tokens)."""
