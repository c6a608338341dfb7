"""The `xirang` command line: it parses, calls and prints (`xirang.cli.main`)."""
