"""One module per subcommand; ``nsysfrag.cli`` registers them."""
