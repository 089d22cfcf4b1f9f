"""The models that place blocks in an address space and report its state after every event."""
