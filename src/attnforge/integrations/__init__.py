"""Glue that makes existing model code call :func:`attnforge.attention`: transformers, diffusers.

Each module imports its library lazily, inside the functions, so importing attnforge never needs them.
"""
