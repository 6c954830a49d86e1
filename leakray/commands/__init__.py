"""The command line, one module per group of subcommands (argparse only, light to import).

The top layer: a command parses its arguments into the typed config and calls a protocol;
nothing below imports it."""
