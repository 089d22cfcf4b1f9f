"""One module per output format; each builds plain data first and renders it second."""
