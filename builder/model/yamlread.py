"""The one safe YAML loader: keeps the line of every mapping key, so errors can point at `matrix.yaml:LINE`.

Bounded at every stage, because a matrix may come from a pull request:
- the file: opened once, fstat'ed, only a regular file is read, and at most MAX_BYTES + 1 bytes of it
  (a directory, a device, a FIFO or a symlink loop is a clear error, never a hang or an endless read);
- the bytes: strict UTF-8 (a bad byte is reported with its offset and line, never silently replaced);
- the document: nodes are counted *while composing*, aliases weighted by the size of what they expand to,
  so a large or alias-bombed file is refused after MAX_NODES nodes instead of after a full parse;
  nesting deeper than MAX_DEPTH is refused before Python's recursion limit is anywhere near.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import yaml

from builder.errors import MatrixError

MAX_BYTES = 1 << 20  # a matrix is hand-written; a megabyte is already absurd
MAX_NODES = 20_000  # 200 entries of ~40 nodes is 8,000; also the bound on alias expansion ("billion laughs")
MAX_DEPTH = 32  # the matrix needs 4 levels (top, entries, entry, runner list)


class LineDict(dict):
    """A dict that knows where it and each of its keys were written."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.line = 0
        self.key_lines: dict = {}


class LineList(list):
    """A list that knows the line of each item (a scalar item has no line of its own otherwise)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.item_lines: list[int] = []


# Messages say what the user wrote ("got list", "got dict"), not how this reader stores it.
LineDict.__name__ = LineDict.__qualname__ = "dict"
LineList.__name__ = LineList.__qualname__ = "list"


class _Limit(Exception):
    def __init__(self, message: str, line: int):
        super().__init__(message)
        self.message, self.line = message, line


class _Loader(yaml.SafeLoader):
    """SafeLoader whose composer counts (expanded) nodes and depth as it goes."""

    def __init__(self, stream):
        super().__init__(stream)
        self._nodes = 0
        self._depth = 0
        self._weight: dict[int, int] = {}  # id(node) -> nodes it stands for, aliases expanded
        self._open: dict[str, int] = {}  # anchors of the collections being composed -> their line

    def compose_node(self, parent, index):
        line = self.peek_event().start_mark.line + 1
        if self.check_event(yaml.AliasEvent):
            anchor = self.peek_event().anchor
            if anchor in self._open:  # `<<: *x` inside &x: PyYAML would merge nothing and say nothing
                raise MatrixError(f"line {line}: alias *{anchor[:40]} is used inside &{anchor[:40]} itself "
                                  f"(line {self._open[anchor]})", "an anchor can only be used after it ends")
            node = self.anchors.get(anchor)
            if node is not None:
                self._count(self._weight.get(id(node), 1), line)
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise _Limit(f"nested more than {MAX_DEPTH} levels deep", line)
        before = self._nodes
        self._count(1, line)
        anchor = self.peek_event().anchor
        if anchor is not None:
            self._open[anchor] = line
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
            self._open.pop(anchor, None)
        self._weight[id(node)] = self._nodes - before
        return node

    def _count(self, n: int, line: int) -> None:
        self._nodes += n
        if self._nodes > MAX_NODES:
            raise _Limit(f"more than {MAX_NODES} YAML nodes (aliases expanded)", line)


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> LineDict:
    # Duplicates are checked among the keys written here; keys brought in by a merge (`<<: *defaults`)
    # may be overridden by a key written here, which is what a merge key is for (yaml.org/type/merge.html).
    written: dict = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str):
            shown = repr(key) if len(repr(key)) <= 40 else repr(key)[:37] + "..."
            raise MatrixError(f"line {key_node.start_mark.line + 1}: keys must be strings, got {shown}",
                              "quote the key")
        if key in written:
            raise MatrixError(f"line {key_node.start_mark.line + 1}: key '{key[:60]}' appears twice in one mapping "
                              f"(first at line {written[key]})", "remove one of them")
        written[key] = key_node.start_mark.line + 1
    loader.flatten_mapping(node)
    result = LineDict()
    result.line = node.start_mark.line + 1
    for key_node, value_node in node.value:  # merged keys come first, so a key written here wins
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str):
            raise MatrixError(f"line {key_node.start_mark.line + 1}: keys must be strings", "quote the key")
        result[key] = loader.construct_object(value_node, deep=True)
        result.key_lines[key] = key_node.start_mark.line + 1
    return result


def _construct_sequence(loader: _Loader, node: yaml.SequenceNode) -> LineList:
    result = LineList(loader.construct_object(item, deep=True) for item in node.value)
    result.item_lines = [item.start_mark.line + 1 for item in node.value]
    return result


def _construct_int(loader: _Loader, node: yaml.ScalarNode) -> int:
    # int() of a few thousand digits raises (CPython's limit) and costs quadratic time below it.
    if len(node.value) > 40:
        raise MatrixError(f"line {node.start_mark.line + 1}: a number of {len(node.value)} characters",
                          "quote it if it is text; no matrix value is a number that long")
    return yaml.SafeLoader.construct_yaml_int(loader, node)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


def read_bounded(path: Path, limit: int | None = None, what: str = "matrix", follow: bool = True) -> bytes:
    """The bytes of a regular file, at most `limit`; anything else is a MatrixError naming the file.
    follow=False: a symbolic link is refused, not followed (files someone else wrote, e.g. the gate's output,
    must not make us read a host file)."""
    limit = MAX_BYTES if limit is None else limit
    hint = f"pass the path of a {what} file"
    # O_NONBLOCK: opening a FIFO must not wait for a writer; O_NOCTTY: a terminal must not become ours.
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags | (0 if follow else os.O_NOFOLLOW))
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise MatrixError(f"{path}: is a symbolic link; not followed", hint) from None
        raise MatrixError(f"{path}: cannot read ({exc.strerror})", hint) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = ("a directory" if stat.S_ISDIR(info.st_mode) else "a FIFO" if stat.S_ISFIFO(info.st_mode)
                    else "a device" if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode)
                    else "a socket" if stat.S_ISSOCK(info.st_mode) else "not a regular file")
            raise MatrixError(f"{path}: is {kind}, not a regular file", hint)
        if info.st_size > limit:
            raise MatrixError(f"{path}: {info.st_size} bytes is too large for a {what} (limit {limit})")
        chunks, total = [], 0
        while total <= limit:
            chunk = os.read(fd, min(1 << 16, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:  # the file grew after fstat
            raise MatrixError(f"{path}: more than {limit} bytes is too large for a {what} (limit {limit})")
        return b"".join(chunks)
    except OSError as exc:
        raise MatrixError(f"{path}: cannot read ({exc.strerror})", hint) from None
    finally:
        os.close(fd)


def decode(path: Path, data: bytes) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise MatrixError(f"{path}:{line}: byte {exc.start} (0x{data[exc.start]:02x}) is not UTF-8",
                          "save the file as UTF-8") from None
    return text.removeprefix("\ufeff")


def _precheck(text: str) -> None:
    """The same node and depth limits, counted over libyaml's C event stream when it is available.

    The pure-Python composer (needed for key lines) spends ~50 us per node; libyaml walks a megabyte in
    milliseconds, so an oversized document is refused without paying for the slow parse. Raises _Limit."""
    try:
        from yaml.cyaml import CParser
    except ImportError:  # PyYAML built without libyaml: the composer's own count still applies
        return
    parser = CParser(text)
    stack: list[list] = [[0, None]]  # [nodes so far, anchor] per open collection
    weights: dict[str, int] = {}
    try:
        while (event := parser.get_event()) is not None:
            if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                stack.append([1, event.anchor])
                if len(stack) - 1 > MAX_DEPTH:
                    raise _Limit(f"nested more than {MAX_DEPTH} levels deep", event.start_mark.line + 1)
                continue
            if isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                n, anchor = stack.pop()
            elif isinstance(event, yaml.ScalarEvent):
                n, anchor = 1, event.anchor
            elif isinstance(event, yaml.AliasEvent):
                n, anchor = weights.get(event.anchor, 1), None
            else:
                continue
            if anchor is not None:
                weights[anchor] = n
            stack[-1][0] += n
            if sum(frame[0] for frame in stack) > MAX_NODES:
                raise _Limit(f"more than {MAX_NODES} YAML nodes (aliases expanded)", event.start_mark.line + 1)
    except yaml.YAMLError:
        return  # the real parse below reports syntax errors with their line
    finally:
        parser.dispose()


def load(path: Path):
    """Parse `path`; every failure is a MatrixError naming the file."""
    path = Path(path)
    text = decode(path, read_bounded(path))
    try:
        _precheck(text)
        loader = _Loader(text)
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except _Limit as exc:
        raise MatrixError(f"{path}:{exc.line}: {exc.message}", "a matrix is a short, flat list of entries") from None
    except MatrixError as exc:
        if str(path) in exc.message:
            raise
        raise MatrixError(f"{path}: {exc.message}", exc.hint) from None
    except ValueError as exc:  # a constructor's own limit, e.g. an integer of more than 4300 digits
        raise MatrixError(f"{path}: a value cannot be read ({str(exc)[:100]})", "quote long values") from None
    except RecursionError:  # MAX_DEPTH keeps the composer shallow; this is the last line of defence
        raise MatrixError(f"{path}: nested too deeply", "a matrix is a short, flat list of entries") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise MatrixError(f"{path}{where}: not valid YAML ({problem})", "fix the syntax at that line") from None
