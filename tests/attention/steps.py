"""The metadata of one packed attention step over shuffled paged blocks, for the tests."""
import torch

from paged_core.attention import AttentionMetadata


def step_metadata(tables: torch.Tensor, seq_lens, query_lens, block_size: int,
                  pad: int = 0) -> AttentionMetadata:
    """Each sequence's last ``query_len`` tokens are new (slots from ``tables``), then ``pad``
    padding rows (slot -1)."""
    slots = []
    for i, (n, q_len) in enumerate(zip(seq_lens, query_lens)):
        pos = torch.arange(n - q_len, n)
        slots.append(tables[i, pos // block_size].long() * block_size + pos % block_size)
    slots.append(torch.full((pad,), -1))
    starts = torch.tensor([0] + list(query_lens)).cumsum(0).to(torch.int32)
    return AttentionMetadata(
        slot_mapping=torch.cat(slots), block_tables=tables,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32), query_start_loc=starts,
        max_query_len=max(query_lens), max_seq_len=max(seq_lens),
        seq_lens_cpu=list(seq_lens), query_lens_cpu=list(query_lens))
