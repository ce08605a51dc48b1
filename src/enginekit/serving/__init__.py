"""Serving what enginekit built: a Triton Inference Server model repository (``serving.triton``) and the
Python-backend models that run inside the server (``serving.triton_models``)."""
