"""The ``pytorch-segments`` model: caching-allocator blocks inside their segments."""
