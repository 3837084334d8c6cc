"""One verification problem: a stable id, the file, blob or part, and what was found."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a bundle: a stable id, the file or blob, and what was found."""

    id: str
    path: str
    message: str

    def __str__(self) -> str:
        return f"[{self.id}] {self.path}: {self.message}"

    def to_dict(self) -> Dict[str, str]:
        return {"id": self.id, "path": self.path, "message": self.message}
