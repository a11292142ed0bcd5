"""Each rank reads only its slices of the checkpoint, and they are the right slices."""
import torch

from paged_core.executor.group import TensorParallelGroup
from paged_core.models.model_loader import load_hf_config, load_model

from ..tiny_models import build_tiny_model


def test_rank_one_of_two_holds_exactly_its_slices(tokenizer, tmp_path):
    from safetensors.torch import load_file

    folder = build_tiny_model("qwen2", str(tmp_path / "qwen2"), tokenizer)  # qkv bias, tied
    full = {k.removeprefix("model."): v for k, v in load_file(f"{folder}/model.safetensors").items()}
    config = load_hf_config(folder)
    # Building and loading a shard needs no process group (collectives run only in forward).
    model = load_model(folder, config, 64, torch.float32, torch.device("cpu"),
                       TensorParallelGroup(rank=1, size=2))
    attn = model.layers[0].self_attn
    hd = model.spec.head_dim  # 4 heads, 2 KV heads: rank 1 has query heads 2-3, KV head 1
    q, k, v = attn.qkv_proj.weight.split([2 * hd, hd, hd])
    assert torch.equal(q, full["layers.0.self_attn.q_proj.weight"][2 * hd:])
    assert torch.equal(k, full["layers.0.self_attn.k_proj.weight"][hd:])
    assert torch.equal(v, full["layers.0.self_attn.v_proj.weight"][hd:])
    assert torch.equal(attn.qkv_proj.bias[:2 * hd], full["layers.0.self_attn.q_proj.bias"][2 * hd:])
    assert torch.equal(attn.o_proj.weight, full["layers.0.self_attn.o_proj.weight"][:, 2 * hd:])
    width = model.spec.intermediate_size // 2
    mlp = model.layers[0].mlp
    assert torch.equal(mlp.gate_up_proj.weight[:width], full["layers.0.mlp.gate_proj.weight"][width:])
    assert torch.equal(mlp.down_proj.weight, full["layers.0.mlp.down_proj.weight"][:, width:])
    vocab = model.shard.vocab_size
    assert torch.equal(model.embed_tokens.weight, full["embed_tokens.weight"][vocab:2 * vocab])
    whole = sum(t.numel() for t in full.values())
    held = sum(p.numel() for p in model.parameters())
    assert held < 0.55 * whole  # norms are replicated, everything else halved
