"""The pure core of trainwatch: events, relation templates, preconditions, the engine.

Nothing in this package performs I/O or imports torch, kafka or faust; the edges
(`producers`, `stream_checkers`, `trainwatch.commands`) feed it decoded data.
"""
