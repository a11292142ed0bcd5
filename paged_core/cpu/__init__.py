"""The CPU runtime: the C++ kernels' builds per ISA level, the ISA ladder, huge pages, OpenMP spinning."""
