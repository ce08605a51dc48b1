"""Any PyTorch vision model (family ``pytorch``): torchvision, timm, a user's module or saved program.

``sources`` parses and builds a model reference, ``spec`` is what a user declares about it, ``table`` what
torchvision's and timm's common heads come declared with, ``family`` the adapter (one class per task), and
``runtime`` its pre/postprocessing.
"""
