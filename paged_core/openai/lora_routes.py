"""vLLM's dynamic LoRA routes, answering only when the engine allows runtime LoRA updating
(``allow_runtime_lora_updating``, as vLLM's ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``; 404 as for
an unknown route otherwise):

- ``POST /v1/load_lora_adapter`` ``{"lora_name": ..., "lora_path": ...}``: serve a PEFT
  adapter under that ``model`` name (400 naming the field when it is taken or refused);
- ``POST /v1/unload_lora_adapter`` ``{"lora_name": ...}``: stop serving it (404 if unknown,
  409 while a request still runs under it).
Both answer 200 with vLLM's plain-text success message.
"""
from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, Field
from starlette.responses import PlainTextResponse

from paged_core.exceptions import ParamValidationError

from .errors import OpenAIError


class LoadLoRAAdapterRequest(BaseModel):
    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)


class UnloadLoRAAdapterRequest(BaseModel):
    lora_name: str = Field(min_length=1)


def lora_router(holder) -> APIRouter:
    """The two routes over ``holder`` (``app.EngineHolder``: ``require()`` gives the engine)."""
    router = APIRouter()

    def updatable():
        engine = holder.require()
        if not engine.allow_runtime_lora_updating:
            raise OpenAIError(404, "Not Found: runtime LoRA updating is off (start the server "
                                   "with allow_runtime_lora_updating=true)")
        return engine

    @router.post("/v1/load_lora_adapter")
    async def load_lora_adapter(body: LoadLoRAAdapterRequest) -> PlainTextResponse:
        engine = updatable()
        try:
            await engine.load_lora_adapter(body.lora_name, body.lora_path)
        except ParamValidationError as exc:
            param = "lora_name" if exc.param == "lora_name" else "lora_path"
            raise OpenAIError(400, str(exc), param=param) from None
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added "
                                 f"successfully.")

    @router.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(body: UnloadLoRAAdapterRequest) -> PlainTextResponse:
        engine = updatable()
        if all(r.lora_name != body.lora_name for r in engine.lora_requests):
            raise OpenAIError(404, f"The lora adapter '{body.lora_name}' cannot be found.",
                              param="lora_name", code="model_not_found")
        if not await engine.unload_lora_adapter(body.lora_name):
            raise OpenAIError(409, f"The lora adapter '{body.lora_name}' is in use by a "
                                   f"request; retry once it finishes", param="lora_name")
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed "
                                 f"successfully.")

    return router
