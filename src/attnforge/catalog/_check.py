"""Strict reading of TOML tables: every problem is collected with its dotted path before one error is raised.

Modelled on pypa/packaging's ``_ErrorCollector``: a data file with five bad fields reports all five.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from attnforge._system.files import MAX_USER_FILE_BYTES, not_utf8
from attnforge.errors import CatalogError
from attnforge.types.versions import parse_major_minor

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

T = TypeVar("T")


@dataclass(frozen=True, slots=True, kw_only=True)
class Sourced:
    """A row of a data file: every fact in the catalog says where it comes from (read by :meth:`Collector.sources`).

    Attributes:
        sources: URLs, files or research notes that back the row; never empty.
    """

    sources: tuple[str, ...]


class Collector:
    """Gathers ``path: problem`` lines; :meth:`finish` raises one :class:`CatalogError` listing them all."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.problems: list[str] = []

    def add(self, path: str, problem: str) -> None:
        self.problems.append(f"{path}: {problem}")

    def schema_version(self, doc: Mapping[str, Any], expected: int) -> None:
        """Record a problem unless the file's top-level ``schema_version`` is ``expected``."""
        if doc.get("schema_version") != expected:
            self.add("schema_version", f"expected {expected}, got {doc.get('schema_version')!r}")

    def finish(self) -> None:
        if self.problems:
            raise CatalogError(
                f"{self.source} has {len(self.problems)} bad field(s)",
                problems=tuple(self.problems),
                hint="fix the listed fields; each names its dotted path in the file",
            )

    # -- typed field readers: return a fallback and record the problem instead of raising ----------------
    def get(self, table: Mapping[str, Any], key: str, path: str, kind: type[T], default: T | None = None) -> T:
        sub = f"{path}.{key}" if path else key
        if key not in table:
            if default is not None:
                return default
            self.add(sub, "missing")
            return _zero(kind)
        value = table[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return value  # type: ignore[return-value]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            self.add(sub, f"expected {kind.__name__}, got {type(value).__name__} {value!r}")
            return _zero(kind)
        return value

    def str_list(self, table: Mapping[str, Any], key: str, path: str, *, allow_empty: bool = True) -> tuple[str, ...]:
        sub = f"{path}.{key}"
        raw = self.get(table, key, path, list)
        out: list[str] = []
        for i, item in enumerate(raw):
            if isinstance(item, str):
                out.append(item)
            else:
                self.add(f"{sub}[{i}]", f"expected str, got {type(item).__name__} {item!r}")
        if not allow_empty and key in table and not raw:
            self.add(sub, "must not be empty")
        return tuple(out)

    def sources(self, table: Mapping[str, Any], path: str) -> tuple[str, ...]:
        """The row's ``sources``: a list of at least one string (every fact in the catalog names its source)."""
        return self.str_list(table, "sources", path, allow_empty=False)

    def parsed(self, value: str, path: str, parse: Callable[[str], T], fallback: T) -> T:
        try:
            return parse(value)
        except (ValueError, TypeError) as exc:
            self.add(path, str(exc))
            return fallback

    def unknown_keys(self, table: Mapping[str, Any], allowed: set[str], path: str) -> None:
        for key in sorted(set(table) - allowed):
            self.add(f"{path}.{key}" if path else key, "unknown field")

    def rows(
        self, doc: Mapping[str, Any], key: str, fields: set[str]
    ) -> Iterator[tuple[str, Mapping[str, Any], str]]:
        """``(id, table, dotted path)`` for each sub-table of ``doc[key]`` (``[backends.flash-attn]``...).

        A missing ``[key]`` table, an entry that is not a table, and unknown fields are recorded; entries that
        are not tables are skipped.
        """
        with self.table(doc, key, "") as tables:
            for rid, raw in tables.items():
                path = f"{key}.{rid}"
                if not isinstance(raw, dict):
                    self.add(path, "expected a table")
                    continue
                self.unknown_keys(raw, fields, path)
                yield rid, raw, path

    def array_rows(
        self, doc: Mapping[str, Any], key: str, fields: set[str] | None = None
    ) -> list[tuple[str, Mapping[str, Any]]]:
        """``(dotted path, table)`` for each entry of the array of tables ``[[key]]``; a missing or empty array,
        entries that are not tables (skipped) and, when ``fields`` is given, fields not in it are recorded."""
        raw = doc.get(key)
        if not isinstance(raw, list) or not raw:
            self.add(key, "missing array of tables" if raw is None else "expected a non-empty array of tables")
            return []
        out: list[tuple[str, Mapping[str, Any]]] = []
        for i, row in enumerate(raw):
            if not isinstance(row, dict):
                self.add(f"{key}[{i}]", "expected a table")
                continue
            if fields is not None:
                self.unknown_keys(row, fields, f"{key}[{i}]")
            out.append((f"{key}[{i}]", row))
        return out

    def major_minor(self, row: Mapping[str, Any], key: str, path: str) -> tuple[int, int]:
        """A ``"12.8"`` field as ``(12, 8)`` (``(0, 0)`` and a recorded problem when it is not one)."""
        return self.parsed(self.get(row, key, path, str), f"{path}.{key}", parse_major_minor, (0, 0))

    @contextmanager
    def table(self, parent: Mapping[str, Any], key: str, path: str) -> Iterator[Mapping[str, Any]]:
        value = parent.get(key)
        if not isinstance(value, dict):
            self.add(f"{path}.{key}" if path else key, "missing table" if value is None else "expected a table")
            yield {}
        else:
            yield value


def _zero(kind: type[T]) -> T:
    return kind()


def read_toml(path: Path) -> dict[str, Any]:
    """Parse one TOML file.

    Raises:
        CatalogError: the file is missing or is not valid TOML (line and column in the cause; not UTF-8 included).
    """
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_USER_FILE_BYTES + 1)  # a team's sources file may be anything: /dev/zero was read whole
        if len(data) > MAX_USER_FILE_BYTES:
            raise CatalogError(f"{path.name} is not a catalog file",
                               cause=f"{path}: longer than {MAX_USER_FILE_BYTES >> 20} MiB")
        return tomllib.loads(data.decode("utf-8"))
    except OSError as exc:
        raise CatalogError(f"cannot read catalog file {path}", cause=exc.strerror) from None
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError(f"{path.name} is not valid TOML", cause=str(exc)) from None
    except RecursionError:  # arrays or inline tables nested thousands deep: tomllib recurses per level
        raise CatalogError(f"{path.name} is not valid TOML", cause=f"{path}: nested too deeply to read") from None
    except UnicodeDecodeError as exc:  # TOML is UTF-8 only (tomllib decodes the bytes itself)
        raise CatalogError(f"{path.name} is not valid TOML", cause=f"{path}: {not_utf8(exc)}",
                           hint="TOML files are UTF-8: save it as UTF-8 text") from None


#: The packaged data files (``catalog/data/*.toml``).
DATA_DIR = Path(__file__).parent / "data"
#: Every data file carries ``schema_version = 1``; bump here when a field changes meaning or is removed.
SCHEMA_VERSION = 1

Parse = Callable[[Mapping[str, Any], Collector], T]


def read_checked(path: Path, top_keys: set[str] | None = None) -> tuple[dict[str, Any], Collector]:
    """Read one data file and check what every file must have: its ``schema_version`` and (when ``top_keys``
    is given) no top-level key outside ``top_keys``. The problems stay in the returned collector.

    Raises:
        CatalogError: the file is missing or not TOML.
    """
    doc = read_toml(path)
    errors = Collector(path.name)
    errors.schema_version(doc, SCHEMA_VERSION)
    if top_keys is not None:
        errors.unknown_keys(doc, {"schema_version", *top_keys}, "")
    return doc, errors


def load_file(name: str, parse: Parse[T], *, path: Path | None = None, top_keys: set[str] | None = None) -> T:
    """The one loader of a catalog data file: read, check the schema, ``parse(doc, errors)``, raise once.

    The packaged file (``path`` None) is read once per process and cached; an explicit ``path`` is always read.

    Raises:
        CatalogError: the file is missing, not TOML, or has bad fields (each named by its dotted path).
    """
    if path is None:
        return _packaged(name, parse, frozenset(top_keys) if top_keys is not None else None)  # type: ignore[no-any-return]
    return _load_file(path, parse, top_keys)


@functools.cache
def _packaged(name: str, parse: Parse[Any], top_keys: frozenset[str] | None) -> Any:
    return _load_file(DATA_DIR / name, parse, set(top_keys) if top_keys is not None else None)


def _load_file(path: Path, parse: Parse[T], top_keys: set[str] | None) -> T:
    doc, errors = read_checked(path, top_keys)
    value = parse(doc, errors)
    errors.finish()
    return value
