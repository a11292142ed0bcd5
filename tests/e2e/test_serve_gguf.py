"""``paged-core serve --model some.gguf`` just works: a GGUF file is a model, served with its
quantized projections as they are stored, under the file's name, and answers like the
offline engine on the same file."""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import openai
import pytest

from .conftest import CHAT, MAX_TOKENS, PROMPTS, free_port, running_server

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def gguf_file() -> str:
    """The embedded model's own GGUF file (Q4_1 projections)."""
    from paged_core.models.embedded_model import embedded_gguf_path

    return embedded_gguf_path()


@pytest.fixture(scope="module")
def offline_texts(gguf_file) -> dict[str, str]:
    """Greedy texts of the offline ``LLM`` on the file, in the servers' float32, one prompt per
    call; the engine serves the file's projections quantized unless told otherwise."""
    from paged_core import LLM, SamplingParams

    llm = LLM(gguf_file, dtype="float32", max_model_len=1024, kv_cache_memory="64MiB")
    assert llm.engine.config.quantization == "gguf"
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0)
    texts = {p: llm.generate(p, params, use_tqdm=False)[0].outputs[0].text for p in PROMPTS}
    texts["<chat>"] = llm.chat(CHAT, params, use_tqdm=False)[0].outputs[0].text
    return texts


def test_the_cli_serves_a_gguf_file_like_the_offline_engine(request, tmp_path, gguf_file,
                                                             offline_texts):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cli = str(Path(sys.executable).with_name("paged-core"))
    assert os.access(cli, os.X_OK), f"no paged-core command beside {sys.executable}"
    cmd = [cli, "serve", "--adapter", "litserve", "--host", "127.0.0.1", "--port", str(port),
           "--model", gguf_file]
    with running_server(request, "gguf-litserve", cmd, f"{url}/health", tmp_path,
                        signal.SIGINT) as server:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0,
                               timeout=120)
        name = Path(gguf_file).name
        assert [m.id for m in client.models.list().data] == [name]
        for prompt in PROMPTS:
            out = client.completions.create(model=name, prompt=prompt, max_tokens=MAX_TOKENS,
                                            temperature=0)
            assert out.choices[0].text == offline_texts[prompt], prompt
        chat = client.chat.completions.create(model=name, messages=CHAT, max_tokens=MAX_TOKENS,
                                              temperature=0)
        assert chat.choices[0].message.content == offline_texts["<chat>"]
    assert server.returncode in (0, 130), f"exit {server.returncode}:\n{server.log_tail()}"
