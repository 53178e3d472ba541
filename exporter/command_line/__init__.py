"""The command line's parts, each with its one job; vitedge/cli.py parses and dispatches with them.

flags.py        the flags several commands share, argparse types, and each target's flag group (from its row)
parsers.py      the parser of every subcommand
config_file.py  `--config FILE`: a command's options from a YAML / TOML / JSON file
settings_args.py the parsed flags of a command -> its one ExportSettings (exporter/core/settings.py)
summary.py      the summary table `export` and `parity` print
crash.py        exit 3: one line, the traceback saved to a file

All torch-free: `vitedge --help` and usage errors stay instant.
"""
