"""Load and validate matrix.yaml into frozen Entry objects (step 1 of the pipeline).

Every value that can reach a Dockerfile is checked against a strict pattern here, so no newline or
shell metacharacter from the matrix can become an instruction.
"""

from __future__ import annotations

import difflib
import fnmatch
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from builder.errors import MatrixError, UserError, mask
from builder.flags import arg, switch
from builder.model import budget, reference, yamlread

DEFAULT_MATRIX = Path("matrix.yaml")
MAX_ENTRIES = 200

# Docker allows uppercase in tags, but we use the tag as a directory and report name everywhere:
# lowercase keeps it one identifier on case-insensitive file systems too.
# Every pattern here is applied with re.fullmatch: `$` also matches before a final newline, and a value
# ending in "\n" would split a Dockerfile instruction or name another directory.
TAG_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}")
BASE_RE = reference.REFERENCE_RE
# No userinfo (credentials belong in a BuildKit secret, not in a file that is committed and rendered),
# no query or fragment: the URL is written into a RUN instruction.
URL_RE = re.compile(r"https?://[A-Za-z0-9.-]+(?::[0-9]{1,5})?(?:/[A-Za-z0-9._~%/+-]*)?")
LABEL_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
ARCH_LIST_RE = re.compile(r"[0-9]{1,2}\.[0-9](?:\+PTX)?(?:;[0-9]{1,2}\.[0-9](?:\+PTX)?){0,15}")
GPU_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}")
NOTE_RE = re.compile(r"[^\x00-\x1f\x7f\\`$\u0085\u2028\u2029]{0,300}")  # one printable line: safe in a comment

# The Python distributions an image pins, in the order used everywhere (tables, labels, locks): the stack every
# entry names, then the optional ones (None where the entry does not pin them). tokenizers, datasets and
# huggingface-hub otherwise come at whatever version the resolver picks; pinned, the compatibility checks judge them.
REQUIRED_PACKAGES = ("torch", "transformers", "deepspeed", "peft", "accelerate", "nvidia-ml-py")
OPTIONAL_PACKAGES = ("flash-attn", "tokenizers", "datasets", "huggingface-hub")
# Unpinned, these come at the version the resolver picks (transformers needs tokenizers and huggingface-hub), so they
# are left out of the pins altogether; an unpinned flash-attn is a pin of None: the image must not have it.
RESOLVER_PICKS = ("tokenizers", "datasets", "huggingface-hub")
PACKAGES = REQUIRED_PACKAGES + OPTIONAL_PACKAGES
# Lock files an entry may declare it cannot complete (with the reason): the one visible exception to
# "every lock pinned", checked by `lock --check` and shown in the catalog.
EXCEPTABLE_LOCKS = ("apt.lock", "flash-attn.lock")


@dataclass(frozen=True)
class Entry:
    tag: str
    image: str
    base: str
    python: str
    cuda: str
    pins: dict  # distribution name -> exact version (None where not installed)
    index_url: str
    runner: tuple[str, ...]
    ci: bool = False
    default: bool = False
    base_source: str = ""
    lock_exceptions: dict = field(default_factory=dict)  # lock file name -> why it cannot be complete
    nvcc: bool = False  # ship nvcc in the runtime image too (the ops stage always has one)
    gpus: tuple[str, ...] | None = None  # GPUs the entry claims; None: compat.yaml toolchain.claims
    cuda_archs: str | None = None  # TORCH_CUDA_ARCH_LIST for the ops; None: compat.yaml default for its CUDA
    size_budget: int | None = None  # bytes the image may have; None: 1.2 × the last release (model/budget.py)
    accept_bugs: tuple[str, ...] = ()  # known release bugs (issue URLs or ids of data/knowledge/bugs.yaml) accepted
    lines: dict = field(default_factory=dict, compare=False, repr=False)
    source: str = "matrix.yaml"

    @property
    def base_digest(self) -> str | None:
        return BASE_RE.fullmatch(self.base).group("digest")

    @property
    def base_name(self) -> str:
        """The base without its digest (name:tag), for display and local substitution."""
        return self.base.split("@", 1)[0]

    @property
    def torch(self) -> str:
        return self.pins["torch"]

    def line(self, key: str) -> int:
        return self.lines.get(key, self.lines.get("tag", 0))


@dataclass(frozen=True)
class Matrix:
    path: Path
    image: str
    entries: tuple[Entry, ...]

    def by_tag(self) -> dict[str, Entry]:
        return {e.tag: e for e in self.entries}

    @property
    def default(self) -> Entry:
        return next(e for e in self.entries if e.default)


# --- field schema -------------------------------------------------------------------------------------


def _version(value, fail: Callable[[str, str], None]) -> str:
    if isinstance(value, float):
        fail(f"{value!r} was read as a number", 'quote it so YAML keeps it as text, e.g. "3.10"')
    if not isinstance(value, str):
        fail(f"expected a version string, got {type(value).__name__}", 'write an exact version, e.g. "2.3.1"')
    try:
        parsed = Version(value)
    except InvalidVersion:
        fail(f"{_shown(value)} is not a version", 'write an exact version such as "2.3.1" (no ranges)')
    if str(parsed) != value:
        fail(f"{_shown(value)} is not in canonical form", f'write "{parsed}"')
    if parsed.local is not None:
        # PEP 440 local labels (+cu121) name a build, not a release; '+' is invalid in a Docker tag and
        # the publish step puts every version into the full tag.
        fail(f"{value!r} has a local version label '+{parsed.local}'",
             f'pin the public release "{parsed.public}"; the CUDA build comes from `cuda:` and the index')
    if parsed.epoch:
        fail(f"{value!r} has an epoch ('{parsed.epoch}!')", "'!' is invalid in a Docker tag; pin a version without one")
    return value


def _short_version(value, fail) -> str:
    value = _version(value, fail)
    if len(Version(value).release) != 2:
        fail(f"{value!r} must be MAJOR.MINOR", 'e.g. "3.11" or "12.1"')
    return value


def _shown(value: str) -> str:
    """A value as an error shows it: repr (so a newline is visible), shortened, credentials masked."""
    text = repr(value)
    return mask(text if len(text) <= 64 else text[:60] + "...'")


def _pattern(regex: re.Pattern, what: str, example: str):
    def check(value, fail) -> str:
        if not isinstance(value, str):
            fail(f"expected text, got {type(value).__name__}", f"write {what}, e.g. {example}")
        if not regex.fullmatch(value):
            fail(f"{_shown(value)} is not {what}", f"use only the allowed characters, e.g. {example}")
        return value

    return check


def _docker_name(problem, what: str, example: str, fuller: str):
    """A field checked with Docker's own reference grammar (`problem` says why a value is not one)."""

    def check(value, fail) -> str:
        if not isinstance(value, str):
            fail(f"expected text, got {type(value).__name__}", f"write {what}, e.g. {example}")
        why = problem(value)
        if why:
            fail(f"{_shown(value)} is not {what}: {why}", f"e.g. {fuller}")
        return value

    return check


_reference = _docker_name(reference.problem, "an image reference Docker accepts", "debian:bookworm-slim",
                          "debian:bookworm-slim@sha256:<64 hex>")
_image_name = _docker_name(reference.name_problem, "an image name", "ghcr.io/acme/train",
                           "ghcr.io/acme/train (no tag, no digest)")


def _index_url(value, fail) -> str:
    if not isinstance(value, str):
        fail(f"expected text, got {type(value).__name__}", "write an index URL, e.g. https://pypi.org/simple")
    if "@" in value:
        # Never echo the value: the part before '@' is a user name and password or a token.
        fail("contains credentials (user:password@ or a token before '@'); they are not shown here",
             "keep the URL plain and give the authenticated URL at build time as a BuildKit secret: "
             "PIP_INDEX_URL=... python -m builder build (it is mounted as the pip_index_url secret)")
    return _pattern(URL_RE, "an http(s) index URL without query, fragment or credentials",
                    "https://pypi.org/simple")(value, fail)


def _bool(value, fail) -> bool:
    if not isinstance(value, bool):
        fail(f"expected true or false, got {value!r}", "write true or false")
    return value


def _word_list(regex, what: str, example: str, allowed: str):
    """A field holding a non-empty list of words, each matching `regex`."""

    def check(value, fail) -> tuple[str, ...]:
        if not isinstance(value, list) or not value:
            fail(f"expected a non-empty list of {what}s", f"e.g. {example}")
        for word in value:
            if not isinstance(word, str) or not regex.fullmatch(word):
                fail(f"{_shown(word)} is not a {what}", allowed)
        return tuple(value)

    return check


_labels = _word_list(LABEL_RE, "runner label", "[self-hosted, linux, x64, gpu]",
                     "letters, digits, '.', '_' and '-' only")
_accepted = _word_list(re.compile(r"https://github\.com/[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+/(?:issues|pull)/[0-9]{1,7}"
                                  r"|[a-z0-9][a-z0-9.-]{0,79}"), "known-bug reference",
                       '["https://github.com/huggingface/peft/issues/1234"]',
                       "the upstream issue URL (https://github.com/OWNER/REPO/issues/N) or the id from "
                       "builder/data/knowledge/bugs.yaml that `validate` named")
_gpus = _word_list(GPU_RE, "GPU model", "[A100, H100] (names from compat.yaml toolchain.gpus)",
                   "letters, digits, '_' and '-' only, e.g. H100")


def _lock_exceptions(value, fail) -> dict:
    if not isinstance(value, dict) or not value:
        fail("expected a mapping of lock file to reason", 'e.g. {apt.lock: "base cannot be run here"}')
    for name, reason in value.items():
        if name not in EXCEPTABLE_LOCKS:
            fail(f"{name!r} cannot be excepted", f"only {', '.join(EXCEPTABLE_LOCKS)} may be")
        if not isinstance(reason, str) or not reason.strip() or not NOTE_RE.fullmatch(reason):
            fail(f"the reason for {name} must be one line of plain text", "say why the lock cannot be complete")
    return dict(value)


def _optional_version(value, fail):
    return None if value is None else _version(value, fail)


# key -> (checker, required). Keys may also be given once under `defaults`.
ENTRY_FIELDS: dict[str, tuple[Callable, bool]] = {
    "tag": (_pattern(TAG_RE, "a valid tag (lowercase a-z 0-9 . _ -, up to 128)", "cu121-torch2.3"), True),
    "base": (_reference, True),
    "base_source": (_pattern(NOTE_RE, "one line of plain text", '"docker-library/repo-info"'), False),
    "python": (_short_version, True),
    "cuda": (_short_version, True),
    **{name: (_version, True) for name in REQUIRED_PACKAGES},
    **{name: (_optional_version, False) for name in OPTIONAL_PACKAGES},
    "index_url": (_index_url, False),
    "runner": (_labels, False),
    "ci": (_bool, False),
    "default": (_bool, False),
    "lock_exceptions": (_lock_exceptions, False),
    "nvcc": (_bool, False),
    "gpus": (_gpus, False),
    "cuda_archs": (_pattern(ARCH_LIST_RE, "a CUDA arch list", '"8.0;9.0+PTX"'), False),
    "size_budget": (budget.parse, False),
    "accept_bugs": (_accepted, False),
}
DEFAULTS_ONLY = {"image": _image_name}
TOP_LEVEL = ("defaults", "entries")
FALLBACKS = {"index_url": "https://pypi.org/simple", "runner": ["self-hosted", "linux", "x64", "gpu"]}


def _key(key: str) -> str:
    """A key as an error shows it, quoted: plain keys as they are, anything odd as a shortened repr."""
    return f"'{key}'" if re.fullmatch(r"[A-Za-z0-9_-]{1,40}", key) else _shown(key)


def _did_you_mean(key: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(sorted(known))}"


class _Reporter:
    def __init__(self, path: Path):
        self.path = path

    def fail(self, line: int, where: str, message: str, hint: str = "") -> None:
        raise MatrixError(f"{self.path}:{line}: {where}: {message}", hint or None)


def load(path: Path = DEFAULT_MATRIX) -> Matrix:
    """Read and validate the matrix. Raises MatrixError with file:line, tag and field."""
    path = Path(path)
    data = yamlread.load(path)
    report = _Reporter(path)
    if data is None:
        report.fail(1, "matrix", "the file is empty", "declare `defaults:` and `entries:` (see README)")
    if not isinstance(data, yamlread.LineDict):
        report.fail(1, "matrix", f"expected a mapping at the top, got {type(data).__name__}",
                    "start with `defaults:` and `entries:`")
    for key in data:
        if key not in TOP_LEVEL:
            report.fail(data.key_lines[key], _key(key), "unknown top-level key", _did_you_mean(key, TOP_LEVEL))
    if "defaults" not in data:
        report.fail(1, "defaults", "missing: the matrix has no `defaults:` section",
                    "add `defaults:` with at least `image: <registry>/<name>` (see README)")
    defaults = _read_defaults(data["defaults"], report, data.key_lines["defaults"])
    raw_entries = data.get("entries")
    if not isinstance(raw_entries, list) or not raw_entries:
        report.fail(data.key_lines.get("entries", 1), "entries", "expected a non-empty list of entries",
                    "add at least one `- tag: ...` entry")
    if len(raw_entries) > MAX_ENTRIES:
        report.fail(data.key_lines["entries"], "entries", f"{len(raw_entries)} entries (limit {MAX_ENTRIES})")
    entries: list[Entry] = []
    seen: dict[str, int] = {}
    for index, raw in enumerate(raw_entries):
        line = raw_entries.item_lines[index] if isinstance(raw_entries, yamlread.LineList) else 1
        entry = _read_entry(raw, index, defaults, report, line)
        if entry.tag in seen:
            report.fail(entry.line("tag"), f"entry '{entry.tag}', field 'tag'",
                        f"duplicate tag (first at line {seen[entry.tag]})", "every entry needs its own tag")
        seen[entry.tag] = entry.line("tag")
        entries.append(entry)
    _check_flags(entries, report)
    return Matrix(path=path, image=defaults["image"], entries=tuple(entries))


def _read_defaults(raw, report: _Reporter, line: int = 1) -> dict:
    if not isinstance(raw, yamlread.LineDict):
        report.fail(line, "defaults", f"expected a mapping, got {type(raw).__name__}",
                    "write `defaults:` followed by indented `key: value` lines")
    known = {**{k: v for k, v in ENTRY_FIELDS.items() if k != "tag"}, **{k: (v, True) for k, v in
                                                                          DEFAULTS_ONLY.items()}}
    values: dict = {"_lines": dict(raw.key_lines)}
    for key, value in raw.items():
        if key not in known:
            report.fail(raw.key_lines[key], f"defaults, field {_key(key)}", "unknown key", _did_you_mean(key, known))
        checker = known[key][0]
        values[key] = checker(value, lambda m, h="", k=key: report.fail(raw.key_lines[k],
                                                                         f"defaults, field '{k}'", m, h))
    if "image" not in values:
        report.fail(raw.line or 1, "defaults", "missing required key 'image'",
                    "name the image repository once, e.g. image: ghcr.io/acme/train")
    return values


def _read_entry(raw, index: int, defaults: dict, report: _Reporter, line: int = 1) -> Entry:
    if not isinstance(raw, yamlread.LineDict):
        report.fail(line, f"entries[{index}]", f"expected a mapping, got {type(raw).__name__}",
                    "each entry is `- tag: ...` followed by its fields")
    tag_value = raw.get("tag")
    name = f"entry '{tag_value}'" if isinstance(tag_value, str) and TAG_RE.fullmatch(tag_value) else f"entries[{index}]"
    for key in raw:
        if key not in ENTRY_FIELDS:
            hint = _did_you_mean(key, ENTRY_FIELDS)
            if key in DEFAULTS_ONLY:
                hint = f"'{key}' is shared by all entries: set it once under `defaults:`"
            report.fail(raw.key_lines[key], f"{name}, field {_key(key)}", "unknown key", hint)
    values: dict = {}
    lines: dict = {}
    for key, (checker, required) in ENTRY_FIELDS.items():
        if key in raw:
            line, value = raw.key_lines[key], raw[key]
        elif key in defaults:
            line, value = defaults["_lines"][key], defaults[key]
            values[key] = value  # already checked when defaults were read
            lines[key] = line
            continue
        elif required:
            report.fail(raw.line, f"{name}", f"missing required field '{key}'",
                        f"add `{key}:` to the entry or under `defaults:`")
            continue
        else:
            continue
        lines[key] = line
        values[key] = checker(value, lambda m, h="", k=key, ln=line: report.fail(ln, f"{name}, field '{k}'", m, h))
    pins = {p: values.get(p) for p in PACKAGES if p not in RESOLVER_PICKS or values.get(p) is not None}
    return Entry(
        tag=values["tag"], image=defaults["image"], base=values["base"], python=values["python"],
        cuda=values["cuda"], pins=pins, index_url=values.get("index_url", FALLBACKS["index_url"]),
        runner=tuple(values.get("runner", FALLBACKS["runner"])), ci=values.get("ci", False),
        default=values.get("default", False), base_source=values.get("base_source", ""),
        lock_exceptions=values.get("lock_exceptions", {}), nvcc=values.get("nvcc", False), gpus=values.get("gpus"),
        cuda_archs=values.get("cuda_archs"), size_budget=values.get("size_budget"),
        accept_bugs=values.get("accept_bugs", ()), lines=lines,
        source=str(report.path),
    )


def _check_flags(entries: Sequence[Entry], report: _Reporter) -> None:
    defaults = [e for e in entries if e.default]
    if len(defaults) != 1:
        line = defaults[1].line("default") if len(defaults) > 1 else 1
        report.fail(line, "entries", f"{len(defaults)} entries have `default: true`",
                    "mark exactly one entry as the default image")


def strict_problems(matrix: Matrix) -> list[str]:
    """What `validate --strict` adds: every base pinned by digest, with its source noted; HTTPS indexes only."""
    problems = []
    for e in matrix.entries:
        if e.index_url.startswith("http://"):
            # pip verifies hashes, but a plain-HTTP index can still be swapped for an older, vulnerable
            # (and correctly hashed) pin set at lock time, and it leaks what is installed.
            problems.append(f"{matrix.path}:{e.line('index_url')}: entry '{e.tag}', field 'index_url': plain http"
                            " — use an https:// index (a local mirror can serve TLS with the CA passed as --ca-bundle)")
        if not e.base_digest:
            problems.append(f"{matrix.path}:{e.line('base')}: entry '{e.tag}', field 'base': not pinned by digest"
                            " — append @sha256:<digest> (and note where it came from in base_source)")
        elif not e.base_source:
            problems.append(f"{matrix.path}:{e.line('base')}: entry '{e.tag}', field 'base_source': missing"
                            " — say where the digest was taken from")
    return problems


def select(matrix: Matrix, patterns: Sequence[str] | None) -> list[Entry]:
    """Entries whose tag matches any of the tags/globs; all when none are given."""
    if not patterns:
        return list(matrix.entries)
    chosen: list[Entry] = []
    tags = [e.tag for e in matrix.entries]
    for pattern in patterns:
        matched = [e for e in matrix.entries if fnmatch.fnmatchcase(e.tag, pattern)]
        if not matched:
            raise UserError(f"no matrix entry matches '{pattern}'",
                            _did_you_mean(pattern, tags).replace("known keys", "known tags"))
        chosen.extend(e for e in matched if e not in chosen)
    return chosen


@dataclass(frozen=True)
class Selection:
    """The TAG.../--all arguments of a verb; a tool whose Options extends this gets them from the CLI."""

    tags: tuple = arg(nargs="*", default=(), metavar="TAG", help="tags or globs (cu12*-torch2.*)")
    all: bool = switch("--all", help="every entry")

    def entries(self, matrix: Matrix) -> list[Entry]:
        return choose(matrix, self.tags, self.all)


def choose(matrix: Matrix, tags: Sequence[str] | None, every: bool, default_all: bool = True) -> list[Entry]:
    """The entries a command line names: tags/globs or --all; no tags means every entry unless the verb
    acts on images (building every entry by accident costs hours)."""
    if tags and every:
        raise UserError("give tags or --all, not both")
    if not tags and not every and not default_all:
        raise UserError("which image? name tags (or globs), or pass --all", f"e.g. {matrix.default.tag}")
    return select(matrix, None if every else tags)
