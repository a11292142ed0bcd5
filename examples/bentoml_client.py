"""Talk to the BentoML-hosted engine with the official ``openai`` client.

Start the server first (engine settings via PAGED_CORE_* variables)::

    PAGED_CORE_DTYPE=float32 bentoml serve paged_core.adapters.bentoml.service:PagedLLM \
        --host 127.0.0.1 --port 3000

then::

    python examples/bentoml_client.py --base-url http://127.0.0.1:3000/v1

The same script works against the LitServe adapter (``--base-url
http://127.0.0.1:8000/v1``): both serve the shared OpenAI routes.
"""
from __future__ import annotations

import argparse

import openai


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", default="http://127.0.0.1:3000/v1")
    args = parser.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key="not-needed")

    model = client.models.list().data[0].id
    print(f"model: {model}")

    completion = client.completions.create(model=model, prompt="The capital of France is",
                                           max_tokens=16, temperature=0)
    print(f"completion: {completion.choices[0].text!r}  usage={completion.usage}")

    print("chat (streamed): ", end="", flush=True)
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Write a haiku about paging."}],
        max_tokens=48, temperature=0.7, seed=0, stream=True)
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            print(chunk.choices[0].delta.content, end="", flush=True)
    print()


if __name__ == "__main__":
    main()
