"""The `msmon` command: main.py builds the parser from one module per subcommand."""
