"""Offline batch generation with the embedded model: greedy, sampled, n > 1, chat.

Run: .venv/bin/python examples/offline_generate.py
"""
from paged_core import LLM, SamplingParams


def main() -> None:
    llm = LLM()  # embedded SmolLM2-135M-Instruct, bfloat16, prefix caching on
    prompts = ["The capital of France is", "A haiku about memory pages:"]
    for out in llm.generate(prompts, SamplingParams(max_tokens=32, temperature=0)):
        print(repr(out.prompt), "->", repr(out.outputs[0].text))

    samples = llm.generate("Name a colour:", SamplingParams(n=4, temperature=0.9, seed=7, max_tokens=8))
    print([c.text for c in samples[0].outputs])

    chat = llm.chat([{"role": "user", "content": "What is paged attention? One sentence."}],
                    SamplingParams(max_tokens=64, temperature=0))
    print(chat[0].outputs[0].text)
    print(llm.stats())


if __name__ == "__main__":
    main()
