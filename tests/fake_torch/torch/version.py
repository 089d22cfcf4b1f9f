"""``torch.version`` of the fake torch."""

cuda = "12.8"
hip = None
