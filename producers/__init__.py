"""Instrumentation of a PyTorch training process and the sinks that ship its events."""
