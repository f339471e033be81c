"""Shared Hypothesis strategies: builder-made configs, and arbitrary (often ds-like) JSON.

``configs()`` draws a random chain of builder verbs with valid arguments (``AUTO`` among them)
and returns the ``Config`` it builds. Field values are drawn from each field's declaration
(``Spec``), so a field added to a section is exercised without touching this file.

``json_values()`` / ``json_dicts()`` draw arbitrary JSON, keys often taken from DeepSpeed's own
vocabulary; ``mutated_ds_dicts()`` takes a real ds_config and breaks it in a few places.

``file_bytes(suffix)`` draws the bytes of a file a user might hand us: random bytes, a document
written in the file's format and then cut short or corrupted, or a hostile one (nesting deeper than
any stack, YAML alias bombs, lone surrogates, numbers of thousands of digits).
"""

from __future__ import annotations

import json
import math
import string
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import tomli_w
from hypothesis import strategies as st

from dsbuild import AUTO, Config
from dsbuild.config import (
    BF16,
    FP16,
    SCHEDULERS,
    AdagradParams,
    AdamParams,
    LambParams,
    LionParams,
    LRRangeTestParams,
    OneCycleParams,
    WarmupCosineLRParams,
    WarmupDecayLRParams,
    WarmupLRParams,
    ZeroOptimization,
    section_classes,
)
from dsbuild.config.fields import Spec, key_of, spec_of
from dsbuild.io.convert import RENAMED_KEYS

__all__ = [
    "DS_KEYS",
    "configs",
    "ds_like_dicts",
    "file_bytes",
    "json_dicts",
    "json_values",
    "mutated_ds_dicts",
    "section_kwargs",
    "section_values",
    "spec_values",
]

# -- JSON ----------------------------------------------------------------------

_NOT_KEYS = {"extra", "ignored", "source", "provenance"}


def _all_ds_keys() -> list[str]:
    keys: set[str] = set()
    classes: list[type[Any]] = [
        *section_classes().values(),
        AdamParams,
        LambParams,
        LionParams,
        AdagradParams,
        WarmupLRParams,
        WarmupDecayLRParams,
        WarmupCosineLRParams,
        OneCycleParams,
        LRRangeTestParams,
    ]
    for cls in classes:
        keys.update(key_of(a) for a in attrs.fields(cls) if a.name not in _NOT_KEYS)
    for renames in RENAMED_KEYS.values():
        keys.update(renames)
    keys.update({"type", "params", "cpu_offload", "cpu_offload_param", "_comment", "compile", "amp", "auto"})
    return sorted(keys)


DS_KEYS: list[str] = _all_ds_keys()
"""Every key dsbuild knows at any level, plus legacy spellings and a few odd ones (``_comment``)."""

keys = st.one_of(st.sampled_from(DS_KEYS), st.text(string.ascii_lowercase + "_", min_size=1, max_size=12), st.text())
"""Dict keys: mostly DeepSpeed's own, sometimes made up, sometimes any text."""


def json_values(*, null: bool = True, finite: bool = True, max_leaves: int = 20) -> st.SearchStrategy[Any]:
    """Any JSON value (nested lists and dicts), ``"auto"`` and ds-like keys included.

    ``null=False`` leaves out ``None`` (TOML has no null); ``finite=False`` lets in what Python's
    ``json.loads`` also accepts: ``NaN`` and ``Infinity``.
    """
    scalars = st.one_of(
        st.booleans(),
        st.integers(min_value=-(2**63), max_value=2**63 - 1),
        st.floats(allow_nan=not finite, allow_infinity=not finite),
        st.text(max_size=20),
        st.sampled_from(["auto", "5e8", "1.0e+9", "cpu", "nvme", "fp16", "bf16", "AdamW", "yes", "3"]),
        *([st.none()] if null else []),
    )
    return st.recursive(
        scalars,
        lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(keys, children, max_size=4)),
        max_leaves=max_leaves,
    )


def json_dicts(*, null: bool = True, finite: bool = True) -> st.SearchStrategy[dict[str, Any]]:
    """A JSON object whose keys are often DeepSpeed keys, with any JSON values under them."""
    return st.dictionaries(keys, json_values(null=null, finite=finite), max_size=6)


def ds_like_dicts() -> st.SearchStrategy[dict[str, Any]]:
    """Nested dicts made of DeepSpeed keys only: wrong places, wrong values, sometimes right."""
    leaves = st.one_of(json_values(max_leaves=3), st.sampled_from([0, 1, 3, 5e8, True, "auto", "cpu"]))
    return st.recursive(
        st.dictionaries(st.sampled_from(DS_KEYS), leaves, max_size=4),
        lambda children: st.dictionaries(st.sampled_from(DS_KEYS), st.one_of(leaves, children), max_size=4),
        max_leaves=12,
    )


# -- field values from declarations -----------------------------------------------

_BIG = 2**40
_PLAIN_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12).filter(
    lambda s: s != "auto"
)


def _ints(spec: Spec) -> st.SearchStrategy[int]:
    lo = -_BIG if spec.ge is None else math.ceil(spec.ge)
    if spec.gt is not None:
        lo = max(lo, math.floor(spec.gt) + 1)
    hi = _BIG if spec.le is None else math.floor(spec.le)
    return st.integers(lo, hi)


def _floats(spec: Spec) -> st.SearchStrategy[float | int]:
    """Numbers in range: floats, and sometimes ints (``lr=1`` is kept an int, as written)."""
    lo = spec.ge if spec.ge is not None else spec.gt if spec.gt is not None else -1e6
    hi = spec.le if spec.le is not None else spec.lt if spec.lt is not None else 1e6
    floats = st.floats(
        lo, hi, exclude_min=spec.gt is not None, exclude_max=spec.lt is not None, allow_nan=False, allow_infinity=False
    )
    int_lo = math.floor(spec.gt) + 1 if spec.gt is not None else math.ceil(lo)
    int_hi = math.ceil(spec.lt) - 1 if spec.lt is not None else math.floor(hi)
    return st.one_of(floats, st.integers(int_lo, int_hi)) if int_lo <= int_hi else floats


def spec_values(spec: Spec, *, auto: bool = True) -> st.SearchStrategy[Any]:
    """A valid value of a field declared by ``spec`` (``AUTO`` too where allowed, when ``auto``)."""
    kind = spec.kind
    base: st.SearchStrategy[Any]
    if kind == "int":
        base = _ints(spec)
    elif kind == "float":
        base = _floats(spec)
    elif kind == "bool":
        base = st.booleans()
    elif kind == "str":
        base = _PLAIN_TEXT
    elif kind == "choice":
        base = st.sampled_from(spec.choices)
    elif kind == "strs":
        item = st.sampled_from(spec.choices) if spec.choices else st.one_of(_PLAIN_TEXT, st.just("auto"))
        items = st.lists(item, max_size=3)
        base = st.one_of(items, items.map(tuple))  # the builder takes lists; the class holds tuples
    elif kind == "pair":
        number = _floats(spec)  # within the bounds: betas are >= 0 and < 1
        pairs = st.tuples(number, number)
        base = st.one_of(pairs, pairs.map(list), st.tuples(number, st.just(AUTO)))
    elif kind == "section":
        assert spec.section is not None
        base = section_values(spec.section)
    elif kind == "mapping":
        base = st.dictionaries(keys, json_values(null=False, max_leaves=6), max_size=4)
    else:
        base = json_values(null=False, max_leaves=6)
    if auto and spec.auto:
        return st.one_of(base, st.just(AUTO))
    return base


def section_kwargs(
    cls: type[Any], *, exclude: tuple[str, ...] = (), sections: bool = True
) -> st.SearchStrategy[dict[str, Any]]:
    """Keyword arguments (by ds key) for some fields of section ``cls``: any subset, valid values."""
    optional: dict[str, st.SearchStrategy[Any]] = {}
    for a in attrs.fields(cls):
        if a.name in _NOT_KEYS or "dsbuild" not in a.metadata or key_of(a) in exclude:
            continue
        spec = spec_of(a)
        if spec.kind == "section" and not sections:
            continue
        optional[key_of(a)] = spec_values(spec)
    return st.fixed_dictionaries({}, optional=optional)


def section_values(cls: type[Any]) -> st.SearchStrategy[Any]:
    """An instance of section ``cls`` with any valid subset of its fields set (nested sections too)."""
    return section_kwargs(cls).map(lambda kw: cls(**kw))


# -- builder chains ----------------------------------------------------------------

Step = Callable[[Config], Config]
"""One builder call with its arguments drawn: the config so far -> the next one."""


def _auto(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(values, st.just(AUTO))


_stage = st.one_of(st.integers(0, 3), st.just(AUTO))
_lr = _auto(st.floats(0, 1, allow_nan=False))

_zero: st.SearchStrategy[Step] = _stage.map(lambda stage: lambda c: c.zero(stage))

_offload_cpu: st.SearchStrategy[Step] = st.builds(
    lambda stage, opt, par, pin: lambda c: c.zero(stage).offload_cpu(optimizer=opt, params=par, pin_memory=pin),
    st.integers(1, 3),
    st.booleans(),
    st.booleans(),
    st.booleans(),
)

_sizes = st.one_of(st.none(), st.integers(0, 10**9))
_offload_nvme: st.SearchStrategy[Step] = st.builds(
    lambda path, opt, par, pin, count, size, in_cpu: (
        lambda c: c.zero(3).offload_nvme(
            path, optimizer=opt, params=par, pin_memory=pin, buffer_count=count, buffer_size=size, max_in_cpu=in_cpu
        )
    ),
    st.sampled_from(["/local_nvme", "/mnt/nvme0/ds", "nvme"]),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    _sizes,
    _sizes,
    _sizes,
)

_precision: st.SearchStrategy[Step] = st.one_of(
    section_kwargs(BF16).map(lambda kw: lambda c: c.bf16(**kw)),
    section_kwargs(FP16).map(lambda kw: lambda c: c.fp16(**kw)),
    st.just(lambda c: c.fp32()),
)

_OPTIMIZER_VERBS: dict[str, type[Any]] = {
    "adamw": AdamParams,
    "adam": AdamParams,
    "lamb": LambParams,
    "lion": LionParams,
    "adagrad": AdagradParams,
}


def _call(verb: str, *args: Any, **kwargs: Any) -> Step:
    return lambda c: getattr(c, verb)(*args, **kwargs)


_optimizer: st.SearchStrategy[Step] = st.one_of(
    *(section_kwargs(params).map(lambda kw, verb=verb: _call(verb, **kw)) for verb, params in _OPTIMIZER_VERBS.items()),
    # DeepSpeed's names in any case take typed params.
    st.sampled_from(["Adam", "AdamW", "adamw", "ADAM", "Lamb", "lion", "Adagrad"]).map(
        lambda name: _call("optimizer", name, lr=AUTO)
    ),
    # Other names (torch.optim classes) take any JSON params.
    st.builds(
        lambda name, kw: _call("optimizer", name, **kw),
        st.sampled_from(["SGD", "RMSprop", "Adafactor", "MyOptimizer"]),
        st.dictionaries(
            st.sampled_from(["lr", "momentum", "nesterov", "betas", "eps", "weight_decay", "foo"]),
            st.one_of(_lr, json_values(null=False, max_leaves=4)),
            max_size=4,
        ),
    ),
)

_SCHEDULER_VERBS: dict[str, type[Any]] = {
    "warmup_lr": WarmupLRParams,
    "warmup_decay_lr": WarmupDecayLRParams,
    "warmup_cosine_lr": WarmupCosineLRParams,
    "one_cycle": OneCycleParams,
    "lr_range_test": LRRangeTestParams,
}
assert len(_SCHEDULER_VERBS) == len(SCHEDULERS)
_SHORT = {
    "warmup_num_steps": "warmup_steps",
    "total_num_steps": "total_steps",
    "warmup_min_lr": "min_lr",
    "warmup_max_lr": "max_lr",
}


def _shorten(kw: dict[str, Any], use_short: bool) -> dict[str, Any]:
    return {(_SHORT.get(k, k) if use_short else k): v for k, v in kw.items()}


_scheduler: st.SearchStrategy[Step] = st.one_of(
    *(
        st.builds(
            lambda kw, short, verb=verb: _call(verb, **_shorten(kw, short)), section_kwargs(params), st.booleans()
        )
        for verb, params in _SCHEDULER_VERBS.items()
    )
)

_size = st.one_of(st.none(), _auto(st.integers(1, 4096)))
_batch: st.SearchStrategy[Step] = st.builds(
    lambda m, g, t: _call("batch", micro=m, grad_accum=g, total=t), _size, _size, _size
)

_clip_grad: st.SearchStrategy[Step] = _auto(st.one_of(st.floats(0, 100, allow_nan=False), st.integers(0, 10))).map(
    lambda norm: _call("clip_grad", norm)
)

_comm_dtype: st.SearchStrategy[Step] = st.sampled_from(["fp32", "fp16", "bf16"]).map(
    lambda dtype: _call("comm_dtype", dtype)
)

# Offload sections mostly come from the offload verbs; here, sometimes, as a table like a file's.
_offload_table = st.fixed_dictionaries(
    {"device": st.sampled_from(["cpu", "none", "nvme"])},
    optional={"pin_memory": st.booleans(), "ratio": st.floats(0, 1, allow_nan=False)},
)
_zero_options: st.SearchStrategy[Step] = st.builds(
    lambda kw, table: _call("zero_options", **kw, **table),
    section_kwargs(ZeroOptimization, exclude=("offload_optimizer", "offload_param")),
    st.one_of(st.just({}), _offload_table.map(lambda t: {"offload_optimizer": t})),
)

_set: st.SearchStrategy[Step] = section_kwargs(
    Config,
    # optimizer and scheduler come from their verbs (a section_values() Optimizer has no type).
    exclude=("optimizer", "scheduler", "extra", "ignored", "source", "provenance"),
).map(lambda kw: _call("set", **kw))

STEPS: tuple[st.SearchStrategy[Step], ...] = (
    _zero,
    _offload_cpu,
    _offload_nvme,
    _precision,
    _optimizer,
    _scheduler,
    _batch,
    _clip_grad,
    _comm_dtype,
    _zero_options,
    _set,
)
"""Every builder verb with valid arguments drawn, as a function from the config so far to the next."""


def configs(max_steps: int = 8) -> st.SearchStrategy[Config]:
    """A ``Config`` made by a random chain of builder verbs with valid arguments (``AUTO`` included)."""

    def build(steps: list[Step]) -> Config:
        config = Config()
        for step in steps:
            config = step(config)
        return config

    return st.lists(st.one_of(*STEPS), max_size=max_steps).map(build)


# -- broken real configs -------------------------------------------------------------


def _paths(d: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    if isinstance(d, Mapping):
        for k, v in d.items():
            out.append((*prefix, k))
            out.extend(_paths(v, (*prefix, k)))
    elif isinstance(d, list):
        for i, v in enumerate(d):
            out.append((*prefix, i))
            out.extend(_paths(v, (*prefix, i)))
    return out


def _replace(d: Any, path: tuple[Any, ...], value: Any) -> None:
    for step in path[:-1]:
        d = d[step]
    d[path[-1]] = value


@st.composite
def mutated_ds_dicts(draw: st.DrawFn) -> dict[str, Any]:
    """A builder-made ds_config with a few values replaced by arbitrary JSON and a few keys added."""
    d = draw(configs()).to_dict()
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(d)
        if paths and draw(st.booleans()):
            _replace(d, draw(st.sampled_from(paths)), draw(json_values(finite=False, max_leaves=4)))
        else:
            tables = [()] + [p for p in paths if isinstance(_get(d, p), dict)]
            table = _get(d, draw(st.sampled_from(tables)))
            table[draw(keys)] = draw(json_values(max_leaves=4))
    return d


def _get(d: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        d = d[step]
    return d


# -- file contents --------------------------------------------------------------------


def _written(suffix: str, data: dict[str, Any]) -> str:
    """``data`` as the text of a ``suffix`` file (JSON where the format cannot hold it)."""
    if suffix == ".toml":
        try:
            return tomli_w.dumps(data)
        except (TypeError, ValueError):  # a null, or a key TOML cannot write
            pass
    elif suffix in (".yaml", ".yml"):
        import yaml

        return str(yaml.safe_dump(data, allow_unicode=True))
    return json.dumps(data)


@st.composite
def _damaged(draw: st.DrawFn, suffix: str) -> bytes:
    """A document in the file's format, then maybe cut short and maybe with a few bytes changed."""
    data = draw(st.one_of(json_dicts(finite=False), ds_like_dicts()))
    raw = bytearray(_written(suffix, data).encode("utf-8", "surrogatepass"))
    if draw(st.booleans()):
        del raw[draw(st.integers(0, len(raw))) :]
    for _ in range(draw(st.integers(0, 3))):
        if raw:
            raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
    return bytes(raw)


def _nested(suffix: str, depth: int, opener: str) -> str:
    """A value ``depth`` tables or lists deep under key ``a``, closed or not."""
    if suffix == ".toml":
        inner = "{a = " * depth + "1" + "}" * depth if opener == "{" else "[" * depth + "]" * depth
        return f"a = {inner}\n"
    if suffix == ".json":
        inner = '{"a": ' * depth + "1" + "}" * depth if opener == "{" else "[" * depth + "]" * depth
        return f'{{"a": {inner}}}'
    inner = "{a: " * depth + "1" + "}" * depth if opener == "{" else "[" * depth + "]" * depth
    return f"a: {inner}\n"


def _alias_bomb(levels: int, width: int) -> str:
    """YAML anchors each listing the one before ``width`` times: ``width ** levels`` values when expanded."""
    lines = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    for i in range(1, levels + 1):
        lines.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


def _merge_bomb(levels: int) -> str:
    """YAML merge keys (``<<``) each merging the mapping before nine times."""
    lines = ["m0: &m0 {a: 1, b: 2}"]
    for i in range(1, levels + 1):
        lines.append(f"m{i}: &m{i} {{<<: [{', '.join([f'*m{i - 1}'] * 9)}], k{i}: 1}}")
    return "\n".join(lines) + "\n"


@st.composite
def _hostile(draw: st.DrawFn, suffix: str) -> bytes:
    """What breaks naive readers: nesting past any stack, alias bombs, lone surrogates, huge numbers."""
    depth = draw(st.one_of(st.integers(1, 80), st.integers(80, 5000)))
    texts = [
        _nested(suffix, depth, draw(st.sampled_from(["{", "["]))),
        ('{"\\ud800": 1, "a\\u001b[2J\\nb": 2}' if suffix == ".json" else '"\\u001b[2J\\nb" = 1\n'),
        f"a = {'9' * draw(st.integers(4000, 6000))}\n"
        if suffix == ".toml"
        else (f'{{"a": {"9" * 5000}}}' if suffix == ".json" else f"a: {'9' * 5000}\n"),
        "\ufeff" + _written(suffix, {"train_batch_size": 8}),
        "\x00" * draw(st.integers(1, 100)),
    ]
    if suffix in (".yaml", ".yml"):
        texts += [
            _alias_bomb(draw(st.integers(1, 9)), draw(st.integers(1, 9))),
            "a: &a [*a]\n",
            _merge_bomb(draw(st.integers(1, 9))),
            "!!python/object/apply:os.system [echo hi]\n",
            "a: 2024-13-45\n",
        ]
    text = draw(st.sampled_from(texts))
    return text.encode("utf-8", "surrogatepass")


def file_bytes(suffix: str) -> st.SearchStrategy[bytes]:
    """The bytes of a ``suffix`` file: random, a damaged document in that format, or a hostile one."""
    return st.one_of(st.binary(max_size=512), _damaged(suffix), _hostile(suffix))


# -- records as datasets hold them, and the options a job's [data] takes (the TRL differential) --------------------


def trl_examples() -> int:
    """Examples per TRL differential property: 300 in the ``ci`` profile, the profile's own count where it is larger
    (``deep``: thousands) or a quick one's (``dev``)."""
    from hypothesis import settings

    count = int(settings().max_examples)
    return max(300, count) if count >= 100 else count


_EDGES = ["", " ", "  ", "\n", "\t", "\r\n", " \n", "\n\n", "\u3000"]
"""What real data holds at either end of a text: nothing, spaces, line breaks, tabs, an ideographic space."""
_INSIDE = ["</s>", "<|im_end|>", "<|im_start|>", "<pad>", "{% generation %}", "### Response:", "\u00e9", "e\u0301",
           "\u4e2d\u6587", "\U0001f600", "def f():\n    return 1"]  # fmt: skip
"""What real content may hold inside: a literal EOS, template markers, accents (composed and combining), CJK, emoji,
code."""


def content(*, allow_empty: bool = True) -> st.SearchStrategy[str]:
    """A text field's content: words, unicode and markers inside, whitespace at either end, now and then long."""
    words = st.text(alphabet=string.ascii_letters + string.digits + " .,?!'-", min_size=1, max_size=12)
    anything = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=6)
    body = st.lists(st.one_of(words, words, anything, st.sampled_from(_INSIDE)), max_size=5).map("".join)
    long = st.text(alphabet=string.ascii_lowercase + " \n", min_size=120, max_size=400)
    text = st.builds(lambda a, b, c: a + b + c, st.sampled_from(_EDGES), st.one_of(body, body, body, long),
                     st.sampled_from(_EDGES))  # fmt: skip
    return text if allow_empty else text.filter(lambda t: t != "")


def _turns(*, tools: bool) -> st.SearchStrategy[list[dict[str, str]]]:
    """A conversation: maybe a system turn, then user/assistant pairs (a tool turn after an assistant now and then),
    ending with the assistant."""
    pair = st.tuples(content(allow_empty=False), content(), st.booleans() if tools else st.just(False))

    def build(system: str | None, pairs: list[tuple[str, str, bool]]) -> list[dict[str, str]]:
        turns = [{"role": "system", "content": system}] if system is not None else []
        for i, (user, assistant, tool) in enumerate(pairs):
            turns += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
            if tool and i < len(pairs) - 1:
                turns.append({"role": "tool", "content": "42"})
        return turns

    return st.builds(build, st.none() | content(allow_empty=False), st.lists(pair, min_size=1, max_size=3))


@attrs.frozen
class DataCase:
    """One drawn case of the TRL differential: dsbuild's records and [data] options, and the same data and options
    as TRL's SFTTrainer takes them."""

    format: str
    records: list[dict[str, Any]]
    trl_records: list[dict[str, Any]]
    tokenizer: str
    """``"fast"`` (the test's byte-like fast tokenizer) or ``"byt5"`` (transformers' ByT5Tokenizer, slow)."""
    chat_template: str | None
    max_length: int
    packing: str | None
    padding_free: bool
    eos_token: str | None
    loss: dict[str, bool]
    """dsbuild's ``*_only_loss`` options as given (an absent one takes dsbuild's default)."""
    trl_loss: dict[str, bool]
    """The same for TRL's ``SFTConfig``."""
    batch_size: int = 1
    """Rows per collated batch."""


def chat_templates() -> dict[str, str]:
    """Chat templates with ``{% generation %}`` markers: dsbuild's fallback, and TRL's own Qwen2.5 and Llama 3
    training templates (read from the installed TRL)."""
    import trl

    from dsbuild.job.formats import FALLBACK_CHAT_TEMPLATE

    folder = Path(trl.__file__).parent / "chat_templates"
    return {
        "fallback": FALLBACK_CHAT_TEMPLATE,
        "qwen2_5_training": (folder / "qwen2_5_training.jinja").read_text(encoding="utf-8"),
        "llama3_training": (folder / "llama3_training.jinja").read_text(encoding="utf-8"),
    }


def _tokenized_record(ids: list[int], masks: tuple[bool, bool, bool], data: st.DataObject) -> dict[str, Any]:
    record: dict[str, Any] = {"input_ids": ids}
    labels, completion, attention = masks
    n = len(ids)
    if labels:
        keep = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
        record["labels"] = [i if k else -100 for i, k in zip(ids, keep, strict=True)]
    if completion:
        start = data.draw(st.integers(0, n))
        record["completion_mask"] = [0] * start + [1] * (n - start)
    if attention:
        record["attention_mask"] = [1] * n
    return record


@st.composite
def data_cases(draw: st.DrawFn, *, chat: bool) -> DataCase:
    """A case for the TRL differential: conversations (``chat``) or not, each format with its options."""
    from dsbuild.data import prompt_of

    tokenizer = draw(st.sampled_from(["fast", "fast", "byt5"]))
    if chat:
        fmt = draw(st.sampled_from(["messages", "sharegpt", "prompt_completion"]))
        tokenizer = "fast"  # TRL's assistant masks need a fast tokenizer's offsets
    else:
        fmt = draw(st.sampled_from(["text", "prompt_completion", "alpaca", "tokenized"]))
    n = draw(st.integers(1, 8))
    if fmt == "text":
        records = [{"text": draw(content())} for _ in range(n)]
        trl_records = records
    elif fmt == "prompt_completion" and not chat:
        records = [{"prompt": draw(content(allow_empty=False)), "completion": draw(content())} for _ in range(n)]
        trl_records = records
    elif fmt == "alpaca":
        records = [
            {"instruction": draw(content(allow_empty=False)), "input": draw(content()), "output": draw(content())}
            for _ in range(n)
        ]
        trl_records = [{"prompt": prompt_of(r, "plain"), "completion": r["output"]} for r in records]
    elif fmt == "tokenized":
        masks = draw(st.tuples(st.booleans(), st.booleans(), st.booleans()))
        data = draw(st.data())
        records = [
            _tokenized_record(draw(st.lists(st.integers(5, 260), min_size=1, max_size=120)), masks, data)
            for _ in range(n)
        ]
        trl_records = records
    else:
        conversations = [draw(_turns(tools=fmt == "messages")) for _ in range(n)]
        if fmt == "messages":
            records = trl_records = [{"messages": c} for c in conversations]
        elif fmt == "sharegpt":
            # ShareGPT's role names become the template's (dsbuild's "sharegpt", LLaMA-Factory's); TRL converts
            # only the keys (from/value), so its templates would see "human" and "gpt": TRL gets the messages.
            names = {"user": "human", "assistant": "gpt", "system": "system"}
            records = [
                {"conversations": [{"from": names[t["role"]], "value": t["content"]} for t in c]} for c in conversations
            ]
            trl_records = [{"messages": c} for c in conversations]
        else:  # conversational prompt/completion: the last assistant turn is the completion
            records = trl_records = [{"prompt": c[:-1], "completion": c[-1:]} for c in conversations]
    templates = chat_templates()
    template = templates[draw(st.sampled_from(sorted(templates)))] if chat else None
    packing = draw(st.sampled_from([None, None, "bfd", "bfd_split", "wrapped"]))
    padding_free = draw(st.booleans()) if packing != "wrapped" else False
    eos = draw(st.sampled_from([None, "<|im_end|>" if tokenizer == "fast" else "<extra_id_0>"]))
    max_length = draw(st.sampled_from([8, 16, 32, 48, 64, 100, 160, 256, 512]))
    loss: dict[str, bool] = {}
    if chat:
        loss["assistant_only_loss"] = draw(st.booleans())
    if fmt in ("prompt_completion", "alpaca", "tokenized"):
        completion = draw(st.sampled_from([None, True, False]))
        if completion is not None:
            loss["completion_only_loss"] = completion
    return DataCase(
        format=fmt,
        records=records,
        trl_records=trl_records,
        tokenizer=tokenizer,
        chat_template=template,
        max_length=max_length,
        packing=packing,
        padding_free=padding_free,
        eos_token=eos,
        loss=loss,
        trl_loss=dict(loss),
        batch_size=draw(st.integers(1, 4)),
    )
