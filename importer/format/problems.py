"""One verification problem: a stable id, the file, blob or part, and what was found."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict

from importer.format.text import printable


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a bundle: a stable id, the file or blob, and what was found."""

    id: str
    path: str
    message: str

    def __str__(self) -> str:
        """One line for people (names and messages escaped: importer/format/text.py); to_dict() is exact."""
        return f"[{self.id}] {printable(self.path)}: {printable(self.message)}"

    def to_dict(self) -> Dict[str, str]:
        return {"id": self.id, "path": self.path, "message": self.message}
