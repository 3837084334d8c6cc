"""YAML composed within bounds (PyYAML's safe loader): a hostile file is refused quickly, never
expanded, never a RecursionError or a MemoryError.

- nesting at most ``depth`` levels, checked as each node is composed (PyYAML's composer recurses);
- at most ``nodes`` nodes composed, and at most ``nodes`` once every alias is counted as the nodes
  it stands for (a "billion laughs" file is a few hundred bytes that stand for 10^9 nodes: counted
  bottom-up, each anchored node once, the count stops at the bound);
- an alias cycle (``&a [*a]``, which the composer allows) is refused.

Only nodes are built (``compose``), never Python objects: no tag runs code, nothing is copied."""

from __future__ import annotations

from typing import Any, Dict, List


class YamlTooBig(Exception):
    """A bound was passed: ``line`` (1-based), what was ``expected`` and what was ``found``."""

    def __init__(self, line: int, expected: str, found: str) -> None:
        super().__init__(f"line {line}: expected {expected}, found {found}")
        self.line, self.expected, self.found = line, expected, found


def compose_bounded(text: str, *, depth: int, nodes: int) -> List[Any]:
    """The documents of ``text`` as PyYAML nodes (empty documents left out), within the bounds."""
    import yaml

    class Loader(yaml.SafeLoader):
        level = 0
        composed = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            events: Any = self  # PyYAML's parser half (untyped)
            mark = events.peek_event().start_mark
            self.composed += 1
            if self.composed > nodes:
                raise YamlTooBig(mark.line + 1, f"at most {nodes} YAML nodes", "more")
            self.level += 1
            try:
                if self.level > depth:
                    raise YamlTooBig(mark.line + 1, f"YAML nested at most {depth} levels deep", "deeper")
                return super().compose_node(parent, index)
            finally:
                self.level -= 1

    loader = Loader(text)
    documents = []
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is not None:
                _expanded_size(node, nodes)
                documents.append(node)
    finally:
        loader.dispose()
    return documents


def _children(node: Any) -> List[Any]:
    import yaml

    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _expanded_size(root: Any, limit: int) -> int:
    """How many nodes ``root`` stands for with every alias expanded; YamlTooBig past ``limit`` or
    on a cycle. Iterative (an alias chain may be long), each node counted once (memo)."""
    size: Dict[int, int] = {}
    started: Dict[int, bool] = {}
    stack = [(root, False)]
    while stack:
        node, finish = stack.pop()
        key = id(node)
        if finish:
            total = 1 + sum(size[id(c)] for c in _children(node))
            if total > limit:
                raise YamlTooBig(node.start_mark.line + 1,
                                 f"at most {limit} YAML nodes with every alias expanded", "more (an alias bomb?)")
            size[key] = total
            continue
        if key in size:
            continue
        if started.get(key):
            raise YamlTooBig(node.start_mark.line + 1, "aliases that do not contain themselves", "a cycle")
        started[key] = True
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node) if id(c) not in size)
    return size[id(root)]
