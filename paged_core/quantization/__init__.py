"""Quantized weights served as they are stored: checkpoint readers that keep a format's
integer levels and scales, and the linears that compute with them."""
