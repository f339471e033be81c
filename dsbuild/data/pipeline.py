"""A job's ``[data]`` made ready to train on: loaded, every record checked, tokenized (``Dataset.map``, cached),
split, cut to ``max_length``, packed; and what that cost, said in numbers.

``check(spec)`` needs no tokenizer: every record of the training and evaluation data is checked, and a bad one
is named by file and line (or ``[i]``). ``load(spec, tokenizer)`` checks, then tokenizes with ``datasets``'
``map(batched=True)``, whose result is cached next to the data's Arrow files: a second run with the same data,
tokenizer and options reads it back instead of tokenizing again.
"""

from __future__ import annotations

import functools
import importlib
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final, overload

import attrs

from .._util.suggest import did_you_mean
from ..env.extras import require
from ..errors import ConfigError, Problem
from ..job.core import Job
from ..job.formats import CHAT_FORMATS, FIELDS
from ..job.spec import DataSpec
from ..job.tasks import JOB_TASKS
from .packing import pack_columns
from .records import Checker, Record, check_record, no_sample_left
from .sources import SMALL, Source, load_source, quiet
from .tokens import (
    Encoding,
    Unusable,
    chat_segments,
    chat_template_for,
    encode,
    stop_untrained,
    template_key,
    with_eos_token,
)

__all__ = ["Datasets", "Samples", "check", "encoding", "load"]

_OPTIONAL: Final = {"alpaca": ("input",), "tokenized": ("labels", "completion_mask", "attention_mask")}
"""Fields a format's records may leave out."""

_BATCH: Final = 1000
"""Records per ``map`` batch (``datasets``' default): also the samples packing sees at once."""


class Samples(Sequence[dict[str, list[int]]]):
    """Tokenized samples backed by a ``datasets.Dataset`` (memory-mapped Arrow): ``samples[i]`` is a dict of id lists.

    A sequence, so ``Session.fit`` and a ``DataLoader`` take it as they take a list; ``__getitems__`` reads a
    whole batch at once.
    """

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        """The ``datasets.Dataset``: ``input_ids``, ``labels`` and, packed, ``position_ids``."""

    def __len__(self) -> int:
        return int(self.dataset.num_rows)

    @overload
    def __getitem__(self, index: int) -> dict[str, list[int]]: ...
    @overload
    def __getitem__(self, index: slice) -> list[dict[str, list[int]]]: ...
    def __getitem__(self, index: int | slice) -> dict[str, list[int]] | list[dict[str, list[int]]]:
        if isinstance(index, slice):
            return self.__getitems__(list(range(*index.indices(len(self)))))
        n = len(self)
        if not -n <= index < n:
            raise IndexError(index)
        row: dict[str, list[int]] = self.dataset[index % n]
        return row

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, list[int]]]:
        if not indices:
            return []
        columns = self.dataset[list(indices)]
        names = list(columns)
        return [dict(zip(names, row, strict=True)) for row in zip(*(columns[name] for name in names), strict=True)]

    def __iter__(self) -> Iterator[dict[str, list[int]]]:
        for start in range(0, len(self), _BATCH):
            yield from self.__getitems__(range(start, min(start + _BATCH, len(self))))


@attrs.frozen
class Datasets:
    """A job's data, tokenized: training and evaluation samples, and what tokenizing cut or left out."""

    train: Sequence[dict[str, list[int]]]
    evaluation: Sequence[dict[str, list[int]]] | None
    note: str
    """What was cut, left out or packed, in numbers; ``""`` when nothing was."""
    cut: tuple[str, ...] = ()
    """One warning per split whose samples ``max_length`` cuts: they lose their end (the end-of-turn or EOS token
    the model learns to stop from), with the ``max_length`` that keeps them all."""
    stop: str = ""
    """TRL's warning when the chat template leaves the assistant's end-of-turn token untrained; ``""`` if not."""


# -- checking ---------------------------------------------------------------------------------------------------


def _processes(spec: DataSpec) -> int | None:
    """``map``'s ``num_proc``: ``None`` (this process) unless the job asks for more than one."""
    return spec.num_proc if spec.num_proc and spec.num_proc > 1 else None


def _sources(spec: DataSpec, cache_dir: str | None) -> tuple[Source, Source | None]:
    records = functools.partial(load_source, cache_dir=cache_dir, fmt=spec.format, columns=spec.names)
    train = records(spec.path, key="data.path", split=spec.split)
    evaluation = None
    if spec.eval_path is not None:
        evaluation = records(spec.eval_path, key="data.eval_path")
    elif isinstance(spec.eval_split, str):
        evaluation = records(spec.path, key="data.eval_split", split=spec.eval_split)
    return train, evaluation


def check_rows(
    batch: Mapping[str, list[Any]], fmt: str, columns: Mapping[str, str], vocab_size: int | None = None
) -> dict[str, list[str]]:
    """``map``'s function for checking: what is wrong with each record of a batch (``""``: nothing)."""
    names = list(batch)
    problems = []
    for row in zip(*(batch[name] for name in names), strict=True):
        _, problem = check_record(dict(zip(names, row, strict=True)), fmt, columns, vocab_size)
        problems.append(problem or "")
    return {"problem": problems}


def _check(source: Source, spec: DataSpec, key: str, vocab_size: int | None = None) -> None:
    """Every record of ``source`` checked; one error naming the bad ones (file and line, or ``[i]``).

    The check is a ``map`` too: a second run on the same data reads its verdict from the cache.
    """
    dataset = source.dataset
    top = FIELDS[spec.format][:1] if spec.format in CHAT_FORMATS else FIELDS[spec.format]
    wanted = [spec.field(name) for name in top]
    present = [name for name in wanted if name in dataset.column_names]
    checker = Checker(spec.format, spec.names)
    if present:
        with quiet(bars=dataset.num_rows > SMALL, logs=True):
            checked = dataset.select_columns(present).map(
                check_rows,
                batched=True,
                batch_size=10 * _BATCH,
                fn_kwargs={"fmt": spec.format, "columns": spec.names, "vocab_size": vocab_size},
                remove_columns=present,
                num_proc=_processes(spec),
                desc=f"dsbuild: checking {source.name}",
            )
        if checked.num_rows and checked.unique("problem") == [""]:
            return
        for problem in checked["problem"]:
            checker.add(problem)
    else:
        for _ in range(dataset.num_rows):
            checker.check({})
    extra = []
    optional = {spec.field(name) for name in _OPTIONAL.get(spec.format, ())}
    for name in wanted:
        if name not in dataset.column_names and name not in optional and checker.bad:
            fields = ", ".join(map(repr, dataset.column_names)) or "none"
            hint = did_you_mean(name, dataset.column_names) or "name the file's field in [data.columns]"
            extra.append(Problem("", f"no record has the field {name!r}; the records' fields are {fields}", hint))
    if extra and checker.bad:
        checker.bad = checker.bad[:3]
        checker.more = 0
    where = source.where([index for index, _ in checker.bad])
    checker.raise_if_bad(source.name, where.__getitem__, key, extra=extra)


def check(spec: DataSpec, *, cache_dir: str | None = None, vocab_size: int | None = None) -> None:
    """Every record of the job's training and evaluation data checked, without a tokenizer (see ``load``)."""
    if spec.format == "preference":
        from .preference import check_data

        return check_data(spec)
    if spec.format == "prompt":
        from .prompts import check_data as check_prompts

        return check_prompts(spec)
    require("reading a job's data", "datasets")
    train, evaluation = _sources(spec, cache_dir)
    _check(train, spec, "data.path", vocab_size)
    if evaluation is not None:
        _check(evaluation, spec, "data.eval_path" if spec.eval_path is not None else "data.eval_split", vocab_size)


# -- tokenizing -------------------------------------------------------------------------------------------------


def encode_rows(
    batch: Mapping[str, list[Any]], tokenizer: Any, options: Encoding, columns: Mapping[str, str]
) -> dict[str, list[Any]]:
    """``map``'s function: a batch of raw records (columns) as samples (``tokens.COLUMNS``)."""
    names = list(batch)
    records: list[Record | None] = []
    for row in zip(*(batch[name] for name in names), strict=True):
        checked, _ = check_record(dict(zip(names, row, strict=True)), options.fmt, columns)
        records.append(checked)
    return encode(records, tokenizer, options)


def pack_rows(batch: Mapping[str, list[Any]], max_length: int, strategy: str = "bfd") -> dict[str, list[list[int]]]:
    """``map``'s function for packing: a batch of samples as packed sequences."""
    return pack_columns(batch, max_length, strategy)


def encoding(spec: DataSpec) -> Encoding:
    """How the job's ``[data]`` turns records into samples."""
    return Encoding(
        spec.format,
        spec.max_length,
        spec.prompts(),
        spec.chat_template,
        spec.loss_on_assistant_only,
        spec.loss_on_completion_only,
        spec.eos_token,
        cut=not (spec.packing and spec.packing_strategy != "bfd"),
    )


def _encoding(spec: DataSpec, tokenizer: Any) -> Encoding:
    options = encoding(spec)
    if spec.eos_token is not None and tokenizer.convert_tokens_to_ids(spec.eos_token) in (None, tokenizer.unk_token_id):
        raise ConfigError(Problem("data.eos_token", f"{spec.eos_token!r} is not a token of the tokenizer"))
    if spec.format in CHAT_FORMATS:  # a template that cannot render a plain exchange fails once, not per record
        probe = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
        try:
            chat_segments(probe, tokenizer, chat_template_for(tokenizer, options.chat_template))
        except Unusable as e:
            raise ConfigError(Problem(template_key(spec.chat_template), str(e))) from None
    return options


def _features(lists: Sequence[str], ints: Sequence[str] = (), strings: Sequence[str] = ()) -> Any:
    """Arrow types of samples: ids as 32-bit integers (half the cache of the 64 bits Python ints would become)."""
    import datasets

    features = {name: datasets.List(datasets.Value("int32")) for name in lists}
    features.update({name: datasets.Value("int32") for name in ints})
    features.update({name: datasets.Value("string") for name in strings})
    return datasets.Features(features)


def _tokenized(source: Source, spec: DataSpec, tokenizer: Any, options: Encoding, what: str) -> Any:
    with quiet(bars=source.dataset.num_rows > SMALL, logs=True):
        dataset = source.dataset.map(
            encode_rows,
            batched=True,
            batch_size=_BATCH,
            fn_kwargs={"tokenizer": tokenizer, "options": options, "columns": spec.names},
            remove_columns=source.dataset.column_names,
            features=_features(
                ["input_ids", "labels"], ["length", "prompt_length", "trained", "labelled"], ["problem"]
            ),
            num_proc=_processes(spec),
            desc=f"dsbuild: tokenizing the {what} data",
        )
    if dataset.num_rows and dataset.unique("problem") != [""]:  # rare: a conversation the chat template refuses
        checker = Checker(spec.format)
        for problem in dataset["problem"]:
            checker.add(problem)
        where = source.where([index for index, _ in checker.bad])
        checker.raise_if_bad(source.name, where.__getitem__)
    return dataset


def _spread(values: Any) -> str:
    """``min/median/max`` of integers."""
    import numpy as np

    return f"{int(values.min())}/{int(np.median(values))}/{int(values.max())}"


def _finish(dataset: Any, spec: DataSpec, name: str, key: str, what: str, notes: list[str], cuts: list[str]) -> Samples:
    """The samples that have a token to train on (packed with ``data.packing``); what was cut goes to ``notes``."""
    import numpy as np

    columns = ("length", "prompt_length", "trained", "labelled")
    stats = dataset.select_columns(list(columns)).with_format("numpy")[:]
    length, prompt, trained, labelled = (np.asarray(stats[column]) for column in columns)
    limit = spec.max_length
    cut = length > limit if encoding(spec).cut else np.zeros(len(length), dtype=bool)
    # TRL's rule: a sample with no label left is left out, unless packed (it still fills its bin).
    keep = np.ones(len(length), dtype=bool) if spec.packing else labelled > 0
    if not (trained > 0).any():
        response = length - prompt
        hint = (
            f"max_length {limit} cuts away every token they train on: prompts are {_spread(prompt)} tokens "
            f"(min/median/max), responses {_spread(response)}; max_length = {int(length.max())} keeps every sample "
            f"whole, {int(prompt.max()) + 1} keeps a token of each response"
        )
        raise no_sample_left(name, len(length), key, hint if len(length) else None)
    if cut.any():
        over = length[cut] - limit
        notes.append(
            f"{int(cut.sum())} of {len(length)} {what} samples cut at max_length {limit}, "
            f"by {_spread(over)} tokens (min/median/max; the longest is {int(length.max())})"
        )
        cuts.append(
            f"{int(cut.sum())} of {len(length)} {what} samples are cut at max_length {limit} and lose their end "
            f"(the end-of-turn or EOS token the model learns to stop from); max_length = {int(length.max())} keeps "
            "them all"
        )
    if not keep.all():
        dropped = int((~keep).sum())
        notes.append(
            f"{dropped} {what} samples left out: no token of theirs is trained on (max_length {limit} cut it away, "
            f"or they had none; their prompts are {_spread(prompt[~keep])} tokens), as TRL leaves them out"
        )
        dataset = dataset.select(np.flatnonzero(keep))
    dataset = dataset.select_columns(["input_ids", "labels"])
    if spec.packing:
        samples = dataset.num_rows
        with quiet(bars=samples > SMALL, logs=True):
            dataset = dataset.map(
                pack_rows,
                batched=True,
                batch_size=_BATCH,
                fn_kwargs={"max_length": limit, "strategy": spec.packing_strategy},
                remove_columns=dataset.column_names,
                features=_features(["input_ids", "labels", "position_ids"]),
                num_proc=_processes(spec),
                desc=f"dsbuild: packing the {what} data",
            )
        kept = length[keep]
        tokens = int(kept.clip(max=limit).sum() if spec.packing_strategy == "bfd" else kept.sum())
        notes.append(
            f"{samples} {what} samples packed ({spec.packing_strategy}) into {dataset.num_rows} sequences of up to "
            f"{limit} tokens ({tokens / (dataset.num_rows * limit):.0%} full)"
        )
    return Samples(dataset)


def load(
    spec: DataSpec | Job,
    tokenizer: Any,
    *,
    seed: int | None = None,
    cache_dir: str | None = None,
    vocab_size: int | None = None,
) -> Datasets:
    """The job's data checked and tokenized: training and evaluation samples and a note of what was cut.

    ``spec``: a job's ``[data]`` (``DataSpec``), or the ``Job`` itself. ``seed`` draws an ``eval_split`` fraction
    (the same records on every rank and every run); default: the job's ``training.seed`` (what ``dsbuild train``
    draws with) for a ``Job``, else 42 (``training.seed``'s default). ``cache_dir``: ``datasets``' cache (default
    ``HF_DATASETS_CACHE``). ``vocab_size``: the model's, which a ``"tokenized"`` record's ids must stay below.
    Raises ``ConfigError`` for a bad record (named by file and line) and for data of which no sample has a token to
    train on (with the lengths it saw).
    """
    if isinstance(spec, Job) and JOB_TASKS[spec.task].reader is not None:
        module, function = str(JOB_TASKS[spec.task].reader).split(":")
        reader = getattr(importlib.import_module(f"{__package__}.{module}"), function)
        return Datasets(*reader(spec, tokenizer))  # the task's own records (pairs, prompts, labelled completions)
    if isinstance(spec, DataSpec) and spec.format == "preference":
        from .preference import load_data

        return Datasets(*load_data(spec, tokenizer))
    if isinstance(spec, DataSpec) and spec.format == "prompt":
        from .prompts import load_data as load_prompts

        return Datasets(*load_prompts(spec, tokenizer))
    if isinstance(spec, Job):
        seed = spec.training.seed if seed is None else seed
        spec = spec.data
    seed = 42 if seed is None else seed
    require("reading a job's data", "datasets")
    train_source, eval_source = _sources(spec, cache_dir)
    eval_key = "data.eval_path" if spec.eval_path is not None else "data.eval_split"
    _check(train_source, spec, "data.path", vocab_size)
    if eval_source is not None:
        _check(eval_source, spec, eval_key, vocab_size)
    options = _encoding(spec, tokenizer)
    tokenizer = with_eos_token(tokenizer, spec.eos_token)
    notes: list[str] = []
    train = _tokenized(train_source, spec, tokenizer, options, "training")
    evaluation = None
    eval_name = eval_source.name if eval_source is not None else f"{train_source.name} (eval_split {spec.eval_split})"
    if eval_source is not None:
        evaluation = _tokenized(eval_source, spec, tokenizer, options, "evaluation")
    elif isinstance(spec.eval_split, float):
        if math.ceil(train.num_rows * spec.eval_split) >= train.num_rows:
            raise ConfigError(
                Problem("data.eval_split", f"{spec.eval_split} of {train.num_rows} records leaves none to train on")
            )
        parts = train.train_test_split(test_size=spec.eval_split, seed=seed)
        train, evaluation = parts["train"], parts["test"]
    cuts: list[str] = []
    train_samples = _finish(train, spec, train_source.name, "data.path", "training", notes, cuts)
    eval_samples = (
        _finish(evaluation, spec, eval_name, eval_key, "evaluation", notes, cuts) if evaluation is not None else None
    )
    return Datasets(
        train_samples, eval_samples, "; ".join(notes), tuple(cuts), stop_untrained(tokenizer, options) or ""
    )
