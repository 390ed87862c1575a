"""Read YAML keeping the line of every mapping key, so errors can point at `matrix.yaml:LINE`."""

from __future__ import annotations

from pathlib import Path

import yaml

from builder.errors import MatrixError

MAX_BYTES = 1 << 20  # a matrix is hand-written; a megabyte is already absurd
MAX_NODES = 50_000  # guards against alias expansion ("billion laughs")


class LineDict(dict):
    """A dict that knows where it and each of its keys were written."""

    line: int = 0
    key_lines: dict


class _Loader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> LineDict:
    loader.flatten_mapping(node)
    result = LineDict()
    result.line = node.start_mark.line + 1
    result.key_lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str):
            raise MatrixError(f"line {key_node.start_mark.line + 1}: keys must be strings, got {key!r}")
        if key in result:
            raise MatrixError(
                f"line {key_node.start_mark.line + 1}: key '{key}' appears twice in one mapping",
                "remove one of them",
            )
        result[key] = loader.construct_object(value_node, deep=True)
        result.key_lines[key] = key_node.start_mark.line + 1
    return result


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _count_nodes(node: yaml.Node) -> int:
    # Aliases point at the same node object; counting each visit bounds the expanded size.
    stack, total = [node], 0
    while stack:
        current = stack.pop()
        total += 1
        if total > MAX_NODES:
            return total
        if isinstance(current, yaml.MappingNode):
            for k, v in current.value:
                stack.extend((k, v))
        elif isinstance(current, yaml.SequenceNode):
            stack.extend(current.value)
    return total


def load(path: Path):
    """Parse `path`; every failure is a MatrixError naming the file."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise MatrixError(f"{path}: cannot read ({exc.strerror})", "pass an existing matrix file") from None
    if size > MAX_BYTES:
        raise MatrixError(f"{path}: {size} bytes is too large for a matrix (limit {MAX_BYTES})")
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        loader = _Loader(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            if _count_nodes(node) > MAX_NODES:
                raise MatrixError(f"{path}: more than {MAX_NODES} YAML nodes (aliases expanded)")
            return loader.construct_document(node)
        finally:
            loader.dispose()
    except MatrixError as exc:
        if str(path) in exc.message:
            raise
        raise MatrixError(f"{path}: {exc.message}", exc.hint) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise MatrixError(f"{path}{where}: not valid YAML ({problem})", "fix the syntax at that line") from None
