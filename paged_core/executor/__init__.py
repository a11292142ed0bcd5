"""Tensor parallelism over ``torch.distributed``: the process group, the workers, the executors.

- ``group``: ``TensorParallelGroup`` (this rank's place and its collectives) and process-group set-up;
- ``worker``: the loop a non-driver rank runs (load its shard, then execute what the driver broadcasts);
- ``launch`` and ``worker_process``: a local worker rank started as a fresh interpreter, and its main;
- ``executor``: what the engine calls to run a step: in process, or over ``tensor_parallel_size`` ranks.
"""
