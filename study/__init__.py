"""Attention normalisation in training: temperature, top-k selection and other normalisers."""
