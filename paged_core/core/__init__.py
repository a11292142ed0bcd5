"""The engine core's pure part (no torch): what runs, where its K/V live, in what order.

- ``sequence``: one stream of tokens and its ``num_computed_tokens`` (the one
  scheduling invariant); ``SequenceOwner``, what the core reads of its request.
- ``block_pool``, ``block_hash``, ``kv_cache_manager``: physical blocks (ref
  counts, LRU free queue, prefix-hash table) and per-sequence block tables.
- ``waiting_queue``, ``scheduler``, ``step_cost``: continuous batching under a
  token budget, priorities, tenants, latency budget.

Nothing here imports torch, a tokenizer or the rest of ``paged_core``; the
tests under ``tests/core`` (``make test-fast``) run it in milliseconds.
"""
