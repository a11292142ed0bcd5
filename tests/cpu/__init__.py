"""The CPU runtime: C++ kernels per ISA level, linears, huge pages, OpenMP."""
