"""One module per ``fastvocab`` subcommand: ``add_arguments(parser)`` and ``run(args) -> int``."""
