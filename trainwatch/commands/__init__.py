"""One module per subcommand; each exposes ``add_arguments(parser)`` and ``run(args) -> int``.

Modules are imported only when their subcommand is chosen, so ``trainwatch check``
never pays for importing torch or faust.
"""
