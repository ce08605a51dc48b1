"""Depth-Anything-V2 through transformers: the family (``family``), its model (``model``: configuration,
exportable forward, original checkpoints) and its runtime processor (``runtime``)."""
