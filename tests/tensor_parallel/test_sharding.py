"""``ShardPlan``: which heads, channels and vocabulary rows each rank holds (no processes)."""
import dataclasses

import pytest

from paged_core.models.spec import DecoderSpec, MoeSpec
from paged_core.models.sharding import ShardPlan, allowed_tensor_parallel_sizes


def spec(heads=8, kv_heads=2, intermediate=96, vocab=10, head_dim=4) -> DecoderSpec:
    return DecoderSpec(model_type="llama", num_layers=1, hidden_size=heads * head_dim,
                       num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                       intermediate_size=intermediate, vocab_size=vocab, rms_norm_eps=1e-6,
                       qkv_bias=True, o_bias=True, mlp_bias=False, qk_norm=False,
                       tie_word_embeddings=False, sliding_windows=(None,))


def test_kv_heads_split_when_there_are_enough_and_replicate_otherwise():
    two = [ShardPlan(spec(), r, 2) for r in range(2)]
    assert [(p.num_heads, p.num_kv_heads, p.kv_head_start) for p in two] == [(4, 1, 0), (4, 1, 1)]
    four = [ShardPlan(spec(), r, 4) for r in range(4)]
    # 8 query heads in groups of 4 per KV head: ranks 0-1 use KV head 0, ranks 2-3 KV head 1.
    assert [(p.num_heads, p.num_kv_heads, p.kv_head_start) for p in four] == \
        [(2, 1, 0), (2, 1, 0), (2, 1, 1), (2, 1, 1)]


def test_checkpoint_slices_per_weight():
    plan = ShardPlan(spec(), 1, 2)  # head_dim 4: q rows 16..32, kv rows 4..8
    assert plan.slice_of("model.layers.0.self_attn.q_proj.weight", (32, 32)) == (slice(16, 32),)
    assert plan.slice_of("model.layers.0.self_attn.k_proj.bias", (8,)) == (slice(4, 8),)
    assert plan.slice_of("model.layers.0.self_attn.o_proj.weight", (32, 32)) == \
        (slice(None), slice(16, 32))
    assert plan.slice_of("model.layers.0.self_attn.o_proj.bias", (32,)) is None  # replicated
    assert plan.slice_of("model.layers.0.mlp.up_proj.weight", (96, 32)) == (slice(48, 96),)
    assert plan.slice_of("model.layers.0.mlp.down_proj.weight", (32, 96)) == \
        (slice(None), slice(48, 96))
    assert plan.slice_of("model.layers.0.input_layernorm.weight", (32,)) is None
    assert ShardPlan(spec(), 0, 1).slice_of("model.embed_tokens.weight", (10, 32)) is None


def test_vocabulary_rows_are_padded_to_a_multiple_of_the_group():
    plans = [ShardPlan(spec(vocab=10), r, 4) for r in range(4)]
    assert [p.vocab_size for p in plans] == [3, 3, 3, 3]
    assert [p.slice_of("lm_head.weight", (10, 32)) for p in plans] == \
        [(slice(0, 3),), (slice(3, 6),), (slice(6, 9),), (slice(9, 10),)]


def test_a_size_that_splits_nothing_evenly_is_refused_with_the_allowed_sizes():
    model = spec(heads=9, kv_heads=3, intermediate=1536)  # the embedded SmolLM2-135M
    assert allowed_tensor_parallel_sizes(model) == [1, 3]
    with pytest.raises(ValueError, match=r"tensor_parallel_size=2 does not divide this model's "
                                         r"9 attention heads; allowed sizes: \[1, 3\]"):
        ShardPlan(model, 0, 2)
    with pytest.raises(ValueError, match="3 KV heads"):
        ShardPlan(spec(heads=12, kv_heads=3, intermediate=96), 0, 4)


def test_expert_weights_split_by_each_experts_width():
    moe = MoeSpec(num_experts=4, top_k=2, intermediate_size=48, norm_top_k=True,
                  float32_weights=False, shared_expert_size=64, sparse_layers=(True,))
    plan = ShardPlan(dataclasses.replace(spec(), moe=moe), 1, 2)  # hidden 32
    assert plan.expert_channels == slice(24, 48) and plan.shared_expert_size == 32
    layer = "model.layers.0.mlp"
    assert plan.slice_of(f"{layer}.experts.3.gate_proj.weight", (48, 32)) == (slice(24, 48),)
    assert plan.slice_of(f"{layer}.experts.3.down_proj.weight", (32, 48)) == \
        (slice(None), slice(24, 48))
    assert plan.slice_of("model.layers.0.block_sparse_moe.experts.0.w2.weight", (32, 48)) == \
        (slice(None), slice(24, 48))  # Mixtral's names
    assert plan.slice_of(f"{layer}.experts.down_proj", (4, 32, 48)) == \
        (slice(None), slice(None), slice(24, 48))
    assert plan.slice_of(f"{layer}.experts.gate_up_proj", (4, 96, 32)) is None  # cut on load
    assert plan.slice_of(f"{layer}.shared_expert.up_proj.weight", (64, 32)) == (slice(32, 64),)
    assert plan.slice_of(f"{layer}.gate.weight", (4, 32)) is None  # the router: replicated
    assert plan.slice_of(f"{layer}.shared_expert_gate.weight", (1, 32)) is None
    narrow = dataclasses.replace(moe, intermediate_size=20)
    with pytest.raises(ValueError, match="an expert width of 20; allowed sizes: \\[1, 2, 4\\]"):
        ShardPlan(dataclasses.replace(spec(), moe=narrow), 0, 8)
