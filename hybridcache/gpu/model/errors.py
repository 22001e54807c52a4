"""The one error loading a checkpoint raises."""

from __future__ import annotations

from pathlib import Path


class CheckpointError(Exception):
    """A checkpoint file is missing, malformed, or does not fit the model; `path` names the file at fault."""

    def __init__(self, path: Path | str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = Path(path)
        self.message = message
