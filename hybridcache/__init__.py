"""hybridcache: an inference server for hybrid language models with an exact hybrid prefix cache."""

__version__ = "0.1.0"
