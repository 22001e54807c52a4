"""The Qwen3.5 text model runtime on paged KV and state slots (see qwen3_5.py), and checkpoint loading."""

from hybridcache.gpu.model.config import ModelConfig, read_model_config
from hybridcache.gpu.model.errors import CheckpointError
from hybridcache.gpu.model.loader import load_model
from hybridcache.gpu.model.qwen3_5 import LayerHook, Qwen35Model

__all__ = ["CheckpointError", "LayerHook", "ModelConfig", "Qwen35Model", "load_model", "read_model_config"]
