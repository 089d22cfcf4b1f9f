"""Real torch's Python layer on the simulated allocator (``shim.install``)."""
