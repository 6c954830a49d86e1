"""The command line, one module per group of subcommands (argparse only, light to import).

The top layer: a command parses its arguments into the typed config and calls a protocol;
nothing below imports it."""


def add_command(subparsers, name: str, help: str, doc: str, add_arguments, run):
    """The subcommand ``name``: ``add_arguments(parser)`` declares its arguments, ``run(args)``
    runs it, and its description is the first line of ``doc`` (the module's docstring)."""
    p = subparsers.add_parser(name, help=help, description=doc.splitlines()[0])
    add_arguments(p)
    p.set_defaults(func=run)
    return p
