"""One module per failure id of the catalogue; each registers itself."""
