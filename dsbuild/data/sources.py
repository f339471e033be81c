"""Where records come from: data files, folders of them, ``save_to_disk`` folders and hub datasets, loaded with
Hugging Face ``datasets`` (Arrow, memory-mapped, cached), and where in them a record is for an error message.

Every file a job names is loaded on its own (so a bad record can be named by file and line) and the files of a
folder are concatenated in name order. Only the functions import ``datasets``.
"""

from __future__ import annotations

import contextlib
import csv
import logging
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from .._util.safe_read import check_json_depth
from ..errors import ConfigError, Problem
from ..job.formats import DATA_SUFFIXES
from .records import first_text, iter_records, json_lines_where, read_records

__all__ = ["SMALL", "Part", "Source", "load_source", "quiet"]

_DISK_MARKERS: Final = ("dataset_dict.json", "state.json")
"""Files ``save_to_disk`` writes at the top of its folder (a DatasetDict, a Dataset)."""


@attrs.frozen
class Part:
    """One file (or folder, or hub dataset) of a source, and how its records are counted in messages."""

    name: str
    """The file as messages name it."""
    kind: str
    """``"jsonl"`` (records by line), ``"csv"`` (by line, past the header), or ``"indexed"`` (``[i]``)."""
    rows: int
    path: Path | None = None


@attrs.frozen
class Source:
    """The records of ``data.path`` (or ``data.eval_path``) as one ``datasets.Dataset``."""

    dataset: Any
    """A ``datasets.Dataset``."""
    name: str
    """What messages name: the file, the folder or the hub id."""
    parts: tuple[Part, ...]

    def where(self, indices: Sequence[int]) -> dict[int, str]:
        """Where each record is: ``line 12``, ``[3]``; with the file first when the source is a folder of files."""
        found: dict[int, str] = {}
        start = 0
        for part in self.parts:
            mine = [i - start for i in indices if start <= i < start + part.rows]
            if mine:
                local = _where(part, mine)
                prefix = f"{part.name}: " if len(self.parts) > 1 else ""
                found.update({start + j: prefix + local[j] for j in mine})
            start += part.rows
        return found


def _where(part: Part, indices: list[int]) -> dict[int, str]:
    if part.kind == "jsonl" and part.path is not None:
        return json_lines_where(part.path, indices)
    if part.kind == "csv" and part.path is not None:
        return _csv_where(part.path, indices)
    return {i: f"[{i}]" for i in indices}


def _csv_where(path: Path, indices: list[int]) -> dict[int, str]:
    """``line N`` where each data row starts (the header is line 1; a quoted value may span lines)."""
    wanted = set(indices)
    found = {}
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        start = 1
        row = -1  # the header
        for values in reader:
            if values:
                if row in wanted:
                    found[row] = f"line {start}"
                row += 1
            start = reader.line_num + 1
    return found


SMALL: Final = 20_000
"""Records (or kilobytes of a file) that load and tokenize in about a second: no progress bar for them."""


@contextlib.contextmanager
def quiet(*, bars: bool = True, logs: bool = False) -> Iterator[None]:
    """``datasets`` without progress bars unless ``bars`` (work long enough to watch), and without its logs unless
    ``logs`` (loading logs a failed fast path before its fallback, a JSON array: the outcome is what counts)."""
    import datasets

    log = logging.getLogger("datasets")
    level = log.level
    if not logs:
        log.setLevel(logging.CRITICAL)
    hide = not bars and datasets.is_progress_bar_enabled()
    if hide:
        datasets.disable_progress_bars()
    try:
        yield
    finally:
        log.setLevel(level)
        if hide:
            datasets.enable_progress_bars()


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    cause = e.__cause__ or e.__context__
    why = text[0] if text else type(e).__name__
    if cause is not None and str(cause).strip():
        why += f" ({type(cause).__name__}: {str(cause).strip().splitlines()[0]})"
    return why


def load_source(
    value: Path | str,
    *,
    key: str,
    split: str = "train",
    cache_dir: str | None = None,
    fmt: str | None = None,
    columns: Mapping[str, str] | None = None,
) -> Source:
    """The records ``value`` names (a file, a folder, a ``save_to_disk`` folder or a hub id), ``split`` of them.

    ``key`` (``data.path``, ``data.eval_path``) names the job's key in errors about the source as a whole; a bad
    file is named by itself. A JSON file ``datasets`` cannot read is read again with the stdlib to name its bad
    lines, checked as ``fmt`` records (a line that is not JSON, or not an object).
    """
    if isinstance(value, str) and not Path(value).exists():
        return _hub(value, key, split, cache_dir)
    path = Path(value)
    if path.is_dir() and any((path / marker).is_file() for marker in _DISK_MARKERS):
        return _disk(path, key, split)
    if path.is_dir():
        files = sorted(
            p
            for p in path.rglob("*")
            if p.is_file()
            and p.suffix.lower() in DATA_SUFFIXES
            and not any(part.startswith(".") for part in p.relative_to(path).parts)
        )
        if not files:
            raise ConfigError(
                Problem(key, f"{path}: no data files in the folder", f"expected {', '.join(DATA_SUFFIXES)} files")
            )
        loaders = sorted({DATA_SUFFIXES[p.suffix.lower()] for p in files})
        if len(loaders) > 1:
            raise ConfigError(
                Problem(key, f"{path}: the folder mixes {' and '.join(loaders)} files", "keep one kind per folder")
            )
    elif path.is_file():
        files = [path]
    else:
        raise ConfigError(Problem(key, f"no such file: {str(path)!r}"))
    if split != "train":
        raise ConfigError(
            Problem(
                "data.split" if key == "data.path" else key,
                f"got {split!r}: {path} holds data files, whose one split is 'train'",
                "give a fraction as data.eval_split (0.05), or data.eval_path",
            )
        )
    parts = [_file(p, path if path.is_dir() else p.parent, cache_dir, fmt, columns) for p in files]
    datasets = [d for d, _ in parts]
    if len(datasets) == 1:
        dataset = datasets[0]
    else:
        import datasets as hf

        try:
            dataset = hf.concatenate_datasets(datasets)
        except ValueError as e:
            raise ConfigError(
                Problem(key, f"{path}: its files do not hold the same fields: {_first_line(e)}")
            ) from None
    return Source(dataset, str(path), tuple(part for _, part in parts))


def _file(
    path: Path, folder: Path, cache_dir: str | None, fmt: str | None, columns: Mapping[str, str] | None
) -> tuple[Any, Part]:
    """One data file as a Dataset (converted to Arrow in the ``datasets`` cache once, then memory-mapped)."""
    import datasets

    source = str(path)
    builder = DATA_SUFFIXES[path.suffix.lower()]
    kind = "indexed"
    options: dict[str, Any] = {}
    if builder in ("json", "csv"):
        try:
            with open(path, encoding="utf-8-sig") as f:
                head = first_text(f, source)
        except UnicodeDecodeError:
            raise ConfigError(Problem("", "not UTF-8 text", "save the data as UTF-8"), source=source) from None
        except OSError as e:
            raise ConfigError(f"cannot read the file: {e.strerror or e}", source=source) from None
        kind = "indexed" if builder == "json" and head == "[" else "jsonl"
        if builder == "json":
            check_json_depth(path)  # pyarrow's JSON reader ends the process on deep nesting
    if builder == "csv":
        kind = "csv"
        with open(path, newline="", encoding="utf-8-sig") as f:
            header = next(csv.reader(f), [])
        # Every field as text: pandas would make "4" a number and "NA" a missing value.
        options = {
            "features": datasets.Features({name: datasets.Value("string") for name in header}),
            "keep_default_na": False,
        }
    elif path.stat().st_size == 0:
        raise ConfigError("the data file is empty", source=source)
    try:
        with quiet(bars=path.stat().st_size > SMALL * 1024):
            dataset = datasets.load_dataset(builder, data_files=[source], split="train", cache_dir=cache_dir, **options)
    except Exception as e:  # datasets' builders raise many kinds of error for a file they cannot read
        if builder == "json":  # the stdlib reader names the line that is not JSON, or not an object
            if fmt is not None:
                read_records(path, fmt, columns=columns)
            else:
                for _ in iter_records(path):
                    pass
        raise ConfigError(f"datasets cannot read it as {builder}: {_first_line(e)}", source=source) from None
    name = str(path.relative_to(folder)) if path.is_relative_to(folder) else source
    return dataset, Part(name, kind, dataset.num_rows, path)


def _pick(found: Any, name: str, key: str, split: str) -> Any:
    """``split`` of a DatasetDict (a Dataset is its own one split)."""
    import datasets

    if isinstance(found, datasets.Dataset):
        if split != "train":
            raise ConfigError(
                Problem(
                    "data.split" if key == "data.path" else key,
                    f"got {split!r}: {name} is one dataset, not a dict of splits",
                )
            )
        return found
    if split not in found:
        splits = ", ".join(map(repr, found))
        raise ConfigError(
            Problem("data.split" if key == "data.path" else key, f"{name} has no split {split!r}; it has {splits}")
        )
    return found[split]


def _disk(path: Path, key: str, split: str) -> Source:
    import datasets

    try:
        found = datasets.load_from_disk(str(path))
    except (OSError, ValueError) as e:
        raise ConfigError(
            Problem(key, f"{path}: not a folder datasets' save_to_disk wrote: {_first_line(e)}")
        ) from None
    dataset = _pick(found, str(path), key, split)
    return Source(dataset, str(path), (Part(str(path), "indexed", dataset.num_rows),))


def _hub(name: str, key: str, split: str, cache_dir: str | None) -> Source:
    import datasets
    from datasets.exceptions import DatasetNotFoundError

    hint = "a local file or folder is relative to the job file"
    try:
        with quiet():
            dataset = datasets.load_dataset(name, split=split, cache_dir=cache_dir)
    except ConnectionError:  # datasets' own words ("... is not cached in None") add nothing
        raise ConfigError(
            Problem(
                key,
                f"{name!r} is not a local file or folder, and the hub cannot be reached to load it",
                f"{hint}; a hub dataset needs the network (HF_HUB_OFFLINE unset) or a copy in the datasets cache",
            )
        ) from None
    except (DatasetNotFoundError, FileNotFoundError):
        raise ConfigError(Problem(key, f"{name!r}: no such local file or folder, nor hub dataset", hint)) from None
    except ValueError as e:
        if "split" in str(e).lower():
            raise ConfigError(
                Problem("data.split" if key == "data.path" else key, f"{name}: {_first_line(e)}")
            ) from None
        raise ConfigError(Problem(key, f"{name}: datasets cannot load it: {_first_line(e)}")) from None
    except Exception as e:  # a hub dataset's own loading code can raise anything
        raise ConfigError(Problem(key, f"{name}: datasets cannot load it: {_first_line(e)}")) from None
    return Source(dataset, name, (Part(name, "indexed", dataset.num_rows),))
