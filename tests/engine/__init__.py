"""The engine end to end in process: request kinds, faults, latency target, structured outputs."""
