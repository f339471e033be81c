"""Job files: reading, every problem at once with its ``section.key``, the run's config, device mappings, interop."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import dsbuild
from dsbuild import Config, ConfigError, Job, Training, load_job
from dsbuild._util.overrides import parse_set
from dsbuild.errors import UnresolvedAutoError
from dsbuild.interop import accelerate_config, for_accelerate, for_hf, to_yaml
from dsbuild.job import LaunchSpec, demo_job_path, is_job, parse_device_mapping
from dsbuild.resolve.hf_table import ACCELERATE_FILLED, ACCELERATE_FILLS, FILLS

REPO = Path(__file__).resolve().parents[2]
DEMO_DATA = demo_job_path().parent / "arith_train.jsonl"


def write_job(tmp_path: Path, text: str, name: str = "job.toml") -> Path:
    """A job file next to a copy of the demo data (``train.jsonl``)."""
    shutil.copy(DEMO_DATA, tmp_path / "train.jsonl")
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


MINIMAL = """
    [model]
    name_or_path = "org/model"
    [data]
    path = "train.jsonl"
    format = "alpaca"
    [training]
    [strategy]
    config = "zero2"
"""


def problems(path: Path, **overrides: Any) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_job(path, overrides)
    assert info.value.source == str(path)
    return [str(p) for p in info.value.problems]


# -- the demo job ------------------------------------------------------------------


def test_demo_job_is_complete_and_clean() -> None:
    """The packaged demo: a from-config Llama, byte tokenizer, ZeRO-3 completed by its training arguments, no diagnostics."""
    job = load_job(None)
    assert job.model.config is not None and job.model.config["model_type"] == "llama"
    assert job.model.tokenizer == "byte" and job.model.hidden_size == 128
    assert job.data.path == DEMO_DATA and job.data.format == "alpaca" and job.data.template == "plain"
    assert job.strategy.ref == "preset zero3" and job.launch == LaunchSpec()
    assert job.output_dir == Path.cwd() / "out" / "demo"  # the demo writes under the current folder
    assert load_job(demo_job_path()).output_dir == demo_job_path().parent / "out" / "demo"  # a file: beside it
    assert job.validate() == []
    d = job.config.to_dict()
    assert d["optimizer"] == {
        "type": "AdamW",
        "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
    }
    assert "scheduler" not in d  # the HF Trainer's own linear schedule runs, as the Trainer adds it
    assert d["bf16"] == {"enabled": "auto"} and d["gradient_clipping"] == "auto"
    resolved = job.resolve().to_dict()
    assert resolved["train_batch_size"] == 16 and resolved["bf16"] == {"enabled": True}
    assert resolved["optimizer"]["params"]["lr"] == job.training.learning_rate


def test_demo_data_is_what_make_data_writes(tmp_path: Path) -> None:
    """The committed arithmetic data is exactly the generator's output (deterministic)."""
    from dsbuild.demo.make_data import main

    main(tmp_path)
    for name in ("arith_train.jsonl", "arith_eval.jsonl"):
        assert (tmp_path / name).read_text() == (demo_job_path().parent / name).read_text(), name
    train = {json.loads(line)["instruction"] + json.loads(line)["input"] for line in DEMO_DATA.open()}
    evaluation = {
        json.loads(line)["instruction"] + json.loads(line)["input"] for line in (tmp_path / "arith_eval.jsonl").open()
    }
    assert len(train) == 480 and len(evaluation) == 64 and not train & evaluation


@pytest.mark.procs
def test_reading_a_job_imports_nothing_heavy() -> None:
    """load_job, validate and resolve stay instant: no torch, deepspeed, transformers or peft."""
    code = (
        "import sys, dsbuild\n"
        "job = dsbuild.load_job(dsbuild.job.demo_job_path()); job.validate(); job.resolve()\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'deepspeed', 'transformers', 'peft'}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# -- every problem at once -------------------------------------------------------------


def test_every_problem_of_a_job_is_reported_at_once(tmp_path: Path) -> None:
    """One ConfigError naming the file, each problem under its section.key, with suggestions."""
    path = write_job(
        tmp_path,
        """
        trainig = 1
        zero_optimization = {stage = 2}

        [model]
        tokenizer = "byte"
        lora_rank = 8
        [model.config]
        model_type = "llama"
        vocab_size = 256
        [model.lora]
        r = 0
        dropout = 1.5

        [data]
        path = "missing.jsonl"
        format = "csv"

        [training]
        learning_rate = "fast"
        eval_steps = -1

        [strategy]
        name = "megatron_train"
        config = "zero3"
        [strategy.overrides.zero_optimization]
        stage = 7

        [launch]
        nnodes = 0
        """,
    )
    assert problems(path) == [
        "trainig: unknown key (did you mean 'training'?)",
        "zero_optimization: unknown key (ds_config keys go under [strategy.overrides]: strategy.overrides.zero_optimization)",
        "model.lora_rank: unknown key (did you mean model.lora.r?)",
        "model.lora.r: got 0, expected an integer > 0",
        "model.lora.dropout: got 1.5, expected a number >= 0 and < 1",
        "model.config.vocab_size: got 256, expected at least 384 for the byte tokenizer (set vocab_size = 384)",
        f"data.path: no such file: {str(tmp_path / 'missing.jsonl')!r} (the training records, relative to the job file)",
        "data.format: got 'csv', expected one of 'alpaca', 'messages', 'prompt_completion', 'sharegpt', 'text', 'tokenized', 'preference', 'prompt', 'unpaired'",
        "training.learning_rate: got 'fast', expected a number >= 0",
        "training.eval_steps: got -1, expected a number > 0",
        "strategy.name: got 'megatron_train', expected 'deepspeed_train' (the only strategy dsbuild runs)",
        "strategy.overrides.zero_optimization.stage: got 7, expected an integer >= 0 and <= 3",
        "launch.nnodes: got 0, expected an integer > 0",
    ]


TABLES = {
    "model": 'name_or_path = "org/model"',
    "data": 'path = "train.jsonl"\nformat = "alpaca"',
    "training": "",
    "strategy": 'config = "zero2"',
}
"""The minimal job, table by table; each bad-job case replaces some of them (None drops one)."""


def job_text(top: str = "", **tables: str | None) -> str:
    parts = [top]
    for name, body in {**TABLES, **tables}.items():
        if body is not None:
            parts.append(f"[{name}]\n{body}")
    return "\n".join(parts) + "\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (job_text('description = "no tables"', model=None, data=None, training=None, strategy=None),
         ["model: missing: a job needs a [model] table", "data: missing: a job needs a [data] table",
          "training: missing: a job needs a [training] table", "strategy: missing: a job needs a [strategy] table",
          "model.name_or_path: missing: give a model directory or hub id, or a [model.config] table with model_type",
          "data.path: missing: the training records (a data file or folder, or a hub dataset id)",
          "data.format: missing: one of 'alpaca', 'messages', 'prompt_completion', 'sharegpt', 'text', 'tokenized', 'preference', 'prompt', 'unpaired'",
          'strategy.config: missing: a preset name (e.g. "zero3"), a config file, or a table of ds_config keys']),
        (job_text("model = 3", model=None), ["model: got 3, expected a table"]),
        (job_text(model="[model.config]\nhidden_size = 64"),
         ['model.config.model_type: missing (e.g. model_type = "llama")',
          "model.tokenizer: missing: a model built from [model.config] needs a tokenizer "
          '(use "byte" for the built-in byte-level tokenizer, or a tokenizer directory / hub id)']),
        (job_text(model='name_or_path = "org/model"\n[model.config]\nmodel_type = "llama"'),
         ["model: both name_or_path and [model.config] are set (keep one)"]),
        (job_text(model='name_or_path = "org/model"\nattn_implementation = "spda"'),
         ["model.attn_implementation: got 'spda', expected one of 'eager', 'sdpa', 'flash_attention_2', "
          "'flash_attention_3', 'flex_attention' or a kernels hub id (did you mean 'sdpa'?)"]),
        (job_text(strategy='strategy_name = "deepspeed_train"\nconfig = "zero2"'),
         ["strategy.strategy_name: unknown key (did you mean name?)"]),
        (job_text(strategy='config = "zero3_ofload"'),
         ["strategy.config: no preset 'zero3_ofload' (did you mean 'zero3_offload'? presets: hf_zero2, hf_zero3, "
          "hf_zero3_offload, zero0, zero1, zero2, zero2_offload, zero3, zero3_nvme, zero3_offload)"]),
        (job_text(strategy='config = "zero2"\n[strategy.overrides]\ngradient_clipp1ng = 1.0'),
         ["strategy.overrides.gradient_clipp1ng: unknown key (did you mean 'gradient_clipping'?)"]),
        (job_text(training='lr_scheduler_type = "warmup_stable_decay"'),
         ["training.lr_scheduler_type: 'warmup_stable_decay' needs scheduler arguments dsbuild does not take (use one "
          "of 'linear', 'cosine', 'cosine_with_restarts', 'polynomial', 'constant', 'constant_with_warmup', "
          "'inverse_sqrt', or set [strategy.overrides.scheduler])"]),
        (job_text(launch="device_mapping = [0, 1, 2]\nnproc_per_node = 2"),
         ["launch.device_mapping: 3 devices for 1 node(s) x 2 process(es) per node "
          "(list one device per process, or leave nproc_per_node out)"]),
        (job_text(launch="device_mapping = [0, 1, 2]\nnnodes = 2"),
         ["launch.device_mapping: 3 devices cannot be shared evenly by 2 nodes (list nproc_per_node x nnodes devices)"]),
    ],
)  # fmt: skip
def test_bad_job_table(tmp_path: Path, text: str, expected: list[str]) -> None:
    """Each mistake gets its own line naming the key, what was expected, and what to do."""
    assert problems(write_job(tmp_path, text)) == expected


def test_dotted_overrides_apply_before_checking(tmp_path: Path) -> None:
    """``--set`` style overrides reach every section; a bad one is reported like a bad file value."""
    path = write_job(tmp_path, MINIMAL)
    job = load_job(path, {"training.max_steps": 7, "strategy.overrides.zero_optimization.stage": 1, "launch.nnodes": 2,
                          "launch.device_mapping": "0-3"})  # fmt: skip
    assert job.training.max_steps == 7 and job.config.zero_optimization is not None
    assert job.config.zero_optimization.stage == 1
    assert job.launch.device_mapping == (0, 1, 2, 3) and job.launch.nproc_per_node == 2 and job.launch.world_size == 4
    assert problems(path, **{"traning.max_steps": 7}) == ["traning: unknown key (did you mean 'training'?)"]
    assert parse_set("training.learning_rate=2e-5") == ("training.learning_rate", 2e-5)
    assert parse_set("launch.device_mapping=0-3") == ("launch.device_mapping", "0-3")  # a bare word is text
    assert parse_set('data.path="a b.jsonl"') == ("data.path", "a b.jsonl")
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        parse_set("training.")


def test_paths_are_relative_to_the_job_file(tmp_path: Path) -> None:
    """data.path and a strategy config file are found next to the job; a local model directory becomes absolute."""
    sub = tmp_path / "jobs"
    sub.mkdir()
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text('{"model_type": "llama", "hidden_size": 96}')
    (sub / "ds.toml").write_text('extends = "zero2"\ntrain_micro_batch_size_per_gpu = 4\n')
    shutil.copy(DEMO_DATA, tmp_path / "train.jsonl")
    (sub / "job.toml").write_text(
        '[model]\nname_or_path = "../model"\n[data]\npath = "../train.jsonl"\nformat = "alpaca"\n'
        '[training]\n[strategy]\nconfig = "ds.toml"\n'
    )
    job = load_job(sub / "job.toml")
    assert job.data.path == tmp_path / "train.jsonl"
    assert job.model.name_or_path == str(tmp_path / "model") and job.model.hidden_size == 96
    assert job.strategy.ref == "file ds.toml" and job.training.per_device_train_batch_size == 4


def test_is_job_tells_jobs_from_configs(tmp_path: Path) -> None:
    path = write_job(tmp_path, MINIMAL)
    config = tmp_path / "ds.toml"
    config.write_text("train_micro_batch_size_per_gpu = 1\n")
    assert is_job(path) and not is_job(config) and not is_job(tmp_path / "missing.toml")


def test_data_options_are_read(tmp_path: Path) -> None:
    """The [data] keys of formats, packing, splits and templates arrive in DataSpec; a hub id stays a string."""
    (tmp_path / "parts").mkdir()
    data_table = r"""
    [data]
    path = "train.jsonl"
    format = "alpaca"
    eval_split = 0.05
    packing = true
    train_on_prompt = true
    num_proc = 2
    template = { prompt_no_input = "Q: {instruction}\nA: ", prompt_input = "Q: {instruction} {input}\nA: " }
    [data.columns]
    output = "answer"
    """
    path = write_job(
        tmp_path, MINIMAL.replace('    [data]\n    path = "train.jsonl"\n    format = "alpaca"\n', data_table)
    )
    data = load_job(path).data
    assert (data.eval_split, data.packing, data.train_on_prompt, data.num_proc) == (0.05, True, True, 2)
    assert data.prompts() == ("Q: {instruction}\nA: ", "Q: {instruction} {input}\nA: ")
    assert data.field("output") == "answer" and data.field("instruction") == "instruction"
    hub = load_job(path, {"data.path": "tatsu-lab/alpaca", "data.eval_split": "test"}).data
    assert hub.path == "tatsu-lab/alpaca" and hub.eval_split == "test"
    assert load_job(path, {"data.path": "parts"}).data.path == tmp_path / "parts"
    chat = load_job(path, {"data.format": "messages", "data.chat_template": "{{ messages }}", "data.columns": {}})
    assert chat.data.chat_template == "{{ messages }}"


def test_bad_data_options_each_name_their_key(tmp_path: Path) -> None:
    """Every [data] mistake is its own line under data.<key>."""
    (tmp_path / "notes.txt").write_text("x")
    path = write_job(tmp_path, MINIMAL)
    assert problems(
        path,
        **{
            "data.eval_split": 1.5,
            "data.eval_path": "train.jsonl",
            "data.template": {"prompt_no_input": "{question}", "prompt_input": "{instruction}"},
            "data.columns": {"outptu": "answer"},
            "data.chat_template": "{{ messages }}",
            "data.packing": "yes",
            "data.num_proc": 0,
        },
    ) == [
        'data.eval_split: got 1.5, expected a fraction between 0 and 1 (0.05) or the name of a split ("test")',
        "data.template.prompt_no_input: {question} is not a field it can fill; it fills {instruction}",
        "data.template.prompt_no_input: missing {instruction}",
        "data.template.prompt_input: missing {input}",
        "data.columns.outptu: unknown key (did you mean 'output'?)",
        "data.packing: got 'yes', expected true or false",
        "data.num_proc: got 0, expected an integer >= 1",
        "data.chat_template: only 'messages', 'sharegpt', 'prompt_completion', 'preference', 'prompt', 'unpaired' records use a chat template; the format is 'alpaca'",
    ]
    assert problems(path, **{"data.path": "notes.txt"}) == [
        f"data.path: not a data file dsbuild reads: {str(tmp_path / 'notes.txt')!r} (expected .json, .jsonl, .csv, "
        ".parquet, .arrow, a folder of them, a save_to_disk folder or a hub dataset id)"
    ]
    assert problems(path, **{"data.path": "data/train.jsonl", "data.eval_split": 0.1, "data.eval_path": "x.csv"}) == [
        f"data.path: no such file: {str(tmp_path / 'data/train.jsonl')!r} (the training records, relative to the job file)",
        f"data.eval_path: no such file: {str(tmp_path / 'x.csv')!r} (the evaluation records, relative to the job file)",
        "data.eval_split: both eval_path and eval_split are set (keep one)",
    ]


def test_a_data_path_that_would_hang_or_loop_is_refused_by_name(tmp_path: Path) -> None:
    """A FIFO (reading it would wait forever) and a symlink loop: one line under data.path, never a read."""
    path = write_job(tmp_path, MINIMAL)
    os.mkfifo(tmp_path / "pipe.jsonl")
    (tmp_path / "a.jsonl").symlink_to(tmp_path / "b.jsonl")
    (tmp_path / "b.jsonl").symlink_to(tmp_path / "a.jsonl")
    assert problems(path, **{"data.path": "pipe.jsonl"}) == [
        f"data.path: {str(tmp_path / 'pipe.jsonl')!r} is a named pipe (FIFO) "
        "(expected the training records: a data file or folder)"
    ]
    assert problems(path, **{"data.path": "a.jsonl"}) == [
        f"data.path: {str(tmp_path / 'a.jsonl')!r} is a symlink loop (expected the training records: a data file or folder)"
    ]


# -- the run's config ------------------------------------------------------------------


def test_a_value_set_once_is_used_by_both_and_set_twice_must_agree(tmp_path: Path) -> None:
    """Explicit config values fill the training arguments [training] leaves unset; both set and different: a conflict."""
    (tmp_path / "ds.json").write_text(
        json.dumps(
            {
                "train_micro_batch_size_per_gpu": 4,
                "gradient_clipping": 0.5,
                "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.8, 0.9]}},
            }
        )
    )
    path = write_job(tmp_path, MINIMAL.replace('"zero2"', '"ds.json"'))
    job = load_job(path)
    t = job.training
    assert (t.per_device_train_batch_size, t.max_grad_norm, t.learning_rate) == (4, 0.5, 1e-3)
    assert (t.adam_beta1, t.adam_beta2) == (0.8, 0.9)
    assert job.validate() == []
    assert "scheduler" not in job.config.to_dict()  # HF's own linear schedule runs, as the Trainer adds it

    conflicting = load_job(path, {"training.learning_rate": 2e-5, "launch.nproc_per_node": 2})
    assert [str(d) for d in conflicting.validate()] == [
        'strategy.config.optimizer.params.lr: 0.001 disagrees with learning_rate = 2e-05 (set the key to "auto" or to 2e-05)'
    ]
    with pytest.raises(ConfigError) as info:
        conflicting.check()
    assert info.value.source == str(path)


@pytest.mark.parametrize("scheduler", ["linear", "cosine", "constant_with_warmup", "constant", "polynomial"])
def test_lr_scheduler_type_leaves_the_schedule_to_hf(tmp_path: Path, scheduler: str) -> None:
    """Without a scheduler in the config, no DeepSpeed scheduler stands in: the run uses HF's own (Session)."""
    job = load_job(write_job(tmp_path, MINIMAL), {"training.lr_scheduler_type": scheduler, "training.max_steps": 50,
                                                   "training.warmup_steps": 5})  # fmt: skip
    assert "scheduler" not in job.resolve(hidden_size=64).to_dict()
    assert job.validate() == []


def test_total_steps_count_the_records_as_session_fit_does(tmp_path: Path) -> None:
    """480 records, 2 processes x micro 4 x accumulation 3, 2.5 epochs: ceil(2.5 x (60 // 3)) = 50 steps."""
    job = load_job(
        write_job(tmp_path, MINIMAL),
        {"training.per_device_train_batch_size": 4, "training.gradient_accumulation_steps": 3,
         "training.num_train_epochs": 2.5, "launch.nproc_per_node": 2},
    )  # fmt: skip
    assert job.total_steps() == 50
    assert job.total_steps(world_size=1) == 100


def test_validate_waits_for_what_only_the_run_knows(tmp_path: Path) -> None:
    """A hub model's hidden size is unknown before loading: the hidden-size "auto" buckets wait for it (no error, no
    stand-in value), and resolve() names the fact it needs."""
    job = load_job(write_job(tmp_path, MINIMAL.replace('"zero2"', '"hf_zero3"')))
    assert job.model.hidden_size is None
    assert [d for d in job.validate() if d.severity == "error"] == []
    with pytest.raises(ConfigError, match="hidden"):
        job.resolve()  # explain / export --resolve need --hidden-size for such a job
    assert job.resolve(hidden_size=64).to_dict()["zero_optimization"]["reduce_bucket_size"] == 4096


def test_resolve_leaves_the_keys_waiting_for_a_fact_auto_and_validate_accepts_only_those(tmp_path: Path) -> None:
    """resolve(waiting_for=["total_steps"]) leaves the schedule's step-count "auto" as it is (nothing stands in for
    the count) and fills the rest; validate(resolved=True) accepts exactly the keys it is told wait."""
    from dsbuild.config.walk import auto_paths
    from dsbuild.resolve.resolution import resolve
    from dsbuild.validate import validate

    job = load_job(write_job(tmp_path, MINIMAL.replace('"zero2"', '"hf_zero3"')))
    config = job.config  # hf_zero3: WarmupDecayLR, every param "auto"
    resolved = resolve(config, training=job.training, hidden_size=64, waiting_for=["total_steps"])
    waiting = auto_paths(resolved)
    assert waiting and all(path.startswith("scheduler.params.") for path in waiting)
    assert not [d for d in validate(resolved, resolved=True, waiting=waiting) if d.severity == "error"]
    assert {d.path for d in validate(resolved, resolved=True) if d.severity == "error"} == set(waiting)
    with pytest.raises(ConfigError, match="total_steps"):
        resolve(config, training=job.training, hidden_size=64)


def test_records_that_make_no_micro_batch_are_a_data_error(tmp_path: Path) -> None:
    """3 records for micro-batches of 4 with dataloader_drop_last: validate says data.path makes no micro-batch (the
    run would fail at its first step), not a one-step run."""
    path = write_job(tmp_path, MINIMAL)
    (tmp_path / "train.jsonl").write_text(
        "".join('{"instruction": "a", "output": "b"}\n' for _ in range(3)), encoding="utf-8"
    )
    job = load_job(path, {"training.per_device_train_batch_size": 4, "strategy.overrides.dataloader_drop_last": True})
    found = [d for d in job.validate() if d.severity == "error"]
    assert [(d.path, d.message) for d in found] == [
        ("data.path", "3 samples make no micro-batch of 4 for each of 1 processes")
    ]


# -- device mappings --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "ids"),
    [
        ("list(range(0,16))", tuple(range(16))),
        ("list( range( 8 ) )", tuple(range(8))),
        ("range(0, 8, 2)", (0, 2, 4, 6)),
        ("0-3", (0, 1, 2, 3)),
        ("0,1,2", (0, 1, 2)),
        ("0-1, 4-5", (0, 1, 4, 5)),
        ("[3, 1]", (3, 1)),
        ("7", (7,)),
        ([0, 2], (0, 2)),
    ],
)
def test_device_mapping_forms(text: Any, ids: tuple[int, ...]) -> None:
    assert parse_device_mapping(text) == ids


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os').system('touch /tmp/pwned')",
        "list(range(0,16)) + [os.system('id')]",
        "[i for i in range(4)]",
        "range(0, 8, 0)",
        "3-1",
        "0,,1",
        "eval('1')",
        "",
    ],
)
def test_device_mapping_never_runs_code(text: str, tmp_path: Path) -> None:
    """Anything but the listed forms is refused, with the forms it takes."""
    with pytest.raises(ConfigError) as info:
        parse_device_mapping(text)
    assert "expected a list of device ids" in str(info.value)


def test_device_mapping_duplicates_and_types() -> None:
    with pytest.raises(ConfigError, match="device 1 listed twice"):
        parse_device_mapping("0-2,1")
    with pytest.raises(ConfigError, match="expected non-negative integers"):
        parse_device_mapping([0, -1])
    with pytest.raises(ConfigError, match="got true"):
        parse_device_mapping(True)


def test_local_devices_of_each_node() -> None:
    """ROLL numbers devices across the cluster: node r takes its run, each id modulo the devices per node."""
    launch = LaunchSpec(nproc_per_node=8, nnodes=2, device_mapping=tuple(range(16)))
    assert launch.local_devices(0, gpus_per_node=8) == tuple(range(8))
    assert launch.local_devices(1, gpus_per_node=8) == tuple(range(8))
    assert LaunchSpec(nproc_per_node=2, device_mapping=(4, 5)).local_devices(0) == (4, 5)
    assert LaunchSpec().local_devices(0) is None


# -- the HF Trainer and Accelerate --------------------------------------------------------


def test_for_hf_sets_every_value_the_trainer_fills_to_auto() -> None:
    """Batch, clipping, precision always; optimizer / scheduler values they take; stage-3 buckets."""
    cfg = Config.zero(3).adamw(lr=1e-3, weight_decay=0.1).warmup_cosine_lr(warmup_num_steps=10).batch(micro=4)
    d = for_hf(cfg).to_dict()
    assert [d[k] for k in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")] == [
        "auto"
    ] * 3
    assert d["gradient_clipping"] == "auto" and d["fp16"] == {"enabled": "auto"} and d["bf16"] == {"enabled": "auto"}
    assert d["optimizer"]["params"] == {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}
    # WarmupCosineLR takes no warmup_min_lr / warmup_max_lr (DeepSpeed would refuse them).
    assert d["scheduler"]["params"] == {"total_num_steps": "auto", "warmup_num_steps": "auto"}
    zero = d["zero_optimization"]
    assert [
        zero[k] for k in ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold")
    ] == ["auto"] * 3
    assert [x for x in for_hf(cfg).validate(target="hf") if x.severity == "error"] == []
    # Below stage 3 no stage-3 bucket is added; without an optimizer the Trainer makes its own.
    low = for_hf(Config.preset("zero2")).to_dict()
    assert "optimizer" not in low and "stage3_prefetch_bucket_size" not in low["zero_optimization"]
    # What the Trainer does with it: every "auto" filled from its arguments (dsbuild resolves the same way).
    training = Training(per_device_train_batch_size=2, learning_rate=3e-4, max_steps=100, bf16=True)
    resolved = for_hf(cfg).resolve(world_size=4, training=training, hidden_size=64).to_dict()
    assert resolved["train_batch_size"] == 8 and resolved["bf16"] == {"enabled": True}
    assert resolved["optimizer"]["params"]["lr"] == 3e-4


def test_accelerate_config_reads_back_in_accelerate(tmp_path: Path) -> None:
    """The YAML (PyYAML's or the hand-written fallback) is a config ``accelerate launch`` loads."""
    settings = accelerate_config("out/ds_config.json", num_processes=4, num_machines=2, zero3_init=True)
    yaml = pytest.importorskip("yaml")
    from dsbuild import interop as job_module

    text = to_yaml(settings)
    hand = "".join(job_module._yaml_lines(settings, 0))
    assert yaml.safe_load(text) == yaml.safe_load(hand) == settings
    config_args = pytest.importorskip("accelerate.commands.config.config_args")
    path = tmp_path / "accelerate.yaml"
    path.write_text(hand)
    loaded = config_args.load_config_from_file(str(path))
    assert str(loaded.distributed_type).endswith("DEEPSPEED")
    assert loaded.num_processes == 4 and loaded.num_machines == 2
    assert loaded.deepspeed_config == {"deepspeed_config_file": "out/ds_config.json", "zero3_init_flag": True}


def test_the_accelerate_config_leaves_what_the_ds_config_decides_to_it() -> None:
    """With a deepspeed_config_file, `accelerate launch` refuses these settings in its config (precision included)."""
    refused = {"mixed_precision", "gradient_accumulation_steps", "gradient_clipping", "zero_stage",
               "offload_optimizer_device", "offload_param_device", "zero3_save_16bit_model"}  # fmt: skip
    settings = accelerate_config("ds.json", zero3_init=True)
    assert not refused & {*settings, *settings["deepspeed_config"]}


def test_for_accelerate_keeps_auto_only_where_accelerate_fills_it() -> None:
    """A plain Accelerate loop fills the batch sizes, DummyOptim's lr / weight decay, DummyScheduler's values and the
    buckets; betas, eps, clipping and precision (which it stops on, or fills with a constant) come from the run."""
    cfg = Config.preset("hf_zero3")
    training = Training(adam_beta2=0.95, max_grad_norm=0.5, bf16=True)
    d = for_accelerate(cfg, world_size=8, training=training).to_dict()
    assert [d[k] for k in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")] == [
        "auto"
    ] * 3
    assert d["optimizer"]["params"] == {"lr": "auto", "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": "auto"}
    assert set(d["scheduler"]["params"].values()) == {"auto"}
    assert (d["gradient_clipping"], d["bf16"], d["fp16"]["enabled"]) == (0.5, {"enabled": True}, False)
    zero = d["zero_optimization"]
    assert zero["reduce_bucket_size"] == zero["stage3_prefetch_bucket_size"] == "auto"
    # Values the config sets and Accelerate does not fill stay as they are; those it fills become "auto".
    mine = for_accelerate(Config.zero(2).adamw(lr=1e-4, betas=(0.8, 0.9)).clip_grad(2.0).batch(micro=2)).to_dict()
    assert mine["optimizer"]["params"] == {"lr": "auto", "betas": [0.8, 0.9], "weight_decay": "auto"}
    assert (mine["gradient_clipping"], mine["train_micro_batch_size_per_gpu"]) == (2.0, "auto")


def test_for_accelerate_refuses_what_nothing_fills_naming_each_key() -> None:
    """Without training arguments, an "auto" Accelerate does not fill is an error naming the key and its argument."""
    with pytest.raises(UnresolvedAutoError) as caught:
        for_accelerate(Config.preset("hf_zero3"))
    assert [p.path for p in caught.value.problems] == [
        "fp16.enabled",
        "bf16.enabled",
        "optimizer.params.betas",
        "optimizer.params.eps",
        "gradient_clipping",
    ]
    assert "adam_beta1 and adam_beta2" in str(caught.value)


def test_what_accelerate_fills_is_read_from_the_hf_table() -> None:
    """One table: the rows marked `accelerate` and Accelerate's own settings are the keys --for accelerate leaves."""
    assert ACCELERATE_FILLED == {f.path for f in FILLS if f.accelerate} | {f.path for f in ACCELERATE_FILLS}
    assert {f.path for f in FILLS if not f.accelerate} == {
        "gradient_clipping",
        "optimizer.params.betas",
        "optimizer.params.eps",
        "fp16.enabled",
        "bf16.enabled",
    }


def test_public_names() -> None:
    assert dsbuild.load_job is load_job and dsbuild.Job is Job
    assert {"load_job", "Job"} <= set(dsbuild.__all__)


def test_launch_backend_and_rays_options(tmp_path: Path) -> None:
    """[launch] backend, max_failures and storage_path (docs/ray.md) are read and checked like every job value."""
    path = write_job(tmp_path, MINIMAL)
    job = load_job(path, {"launch.backend": "ray", "launch.max_failures": 2, "launch.storage_path": "s3://b/run"})
    assert (job.launch.backend, job.launch.max_failures, job.launch.storage_path) == ("ray", 2, "s3://b/run")
    assert load_job(path).launch.backend == "torchrun" and load_job(path).launch.max_failures == 0
    assert problems(path, **{"launch.backend": "slurm", "launch.max_failures": -2}) == [
        "launch.backend: got 'slurm', expected one of 'torchrun', 'ray'",
        "launch.max_failures: got -2, expected an integer >= -1",
    ]


# -- task = "dpo" ----------------------------------------------------------------------------------------------------

DPO = """
    task = "dpo"
    [model]
    name_or_path = "org/model"
    [data]
    path = "pairs.jsonl"
    format = "preference"
    [training]
    [strategy]
    config = "zero3"
"""


def write_pairs(tmp_path: Path) -> None:
    (tmp_path / "pairs.jsonl").write_text('{"prompt": "a", "chosen": " b", "rejected": " c"}\n' * 4, encoding="utf-8")


def test_a_dpo_job_reads_its_tables_with_trls_defaults(tmp_path: Path) -> None:
    """``task = "dpo"`` reads ``[reference]`` and ``[dpo]`` (TRL's DPOConfig names and defaults when left out); an
    SFT job has neither, and the steps count the pairs."""
    write_pairs(tmp_path)
    job = load_job(write_job(tmp_path, DPO + "    [reference]\n    precompute = true\n    [dpo]\n    beta = 0.5\n"))
    assert job.task == "dpo" and job.reference is not None and job.dpo is not None
    assert job.reference.precompute and job.reference.path is None
    assert (job.dpo.beta, job.dpo.loss_type, job.dpo.max_length) == (0.5, ("sigmoid",), 1024)
    assert job.total_steps() == 3  # 4 pairs: one step an epoch (8 per device by default), 3 epochs (HF default)
    defaults = load_job(write_job(tmp_path, DPO, "defaults.toml"))
    assert defaults.dpo is not None and defaults.dpo.beta == 0.1 and defaults.reference is not None
    sft = load_job(write_job(tmp_path, MINIMAL, "sft.toml"))
    assert (sft.task, sft.reference, sft.dpo) == ("sft", None, None)


def test_every_problem_of_a_dpo_job_is_reported_at_once(tmp_path: Path) -> None:
    """Bad [dpo] values, TRL's rules between them, what dsbuild train does not run, [data] keys DPO does not read, a
    reference that cannot be both precomputed and offloaded: one error, each under its dotted key."""
    write_pairs(tmp_path)
    text = (
        DPO.replace('format = "preference"', 'format = "preference"\n    max_length = 64')
        + """
    [reference]
    precompute = true
    offload = true
    [dpo]
    beta = -1
    loss_type = ["sigmoid", "nope"]
    use_weighting = true
    """
    )
    found = problems(write_job(tmp_path, text))
    assert any(p.startswith('data.max_length: not read for task = "dpo"') for p in found), found
    assert any(p.startswith("reference.offload:") for p in found), found
    assert any(p.startswith("dpo.beta:") for p in found), found
    assert any(p.startswith("dpo.loss_type:") and "nope" in p for p in found), found
    assert any(p.startswith("dpo.use_weighting:") for p in found), found


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (MINIMAL + "    [dpo]\n    beta = 0.2\n", "dpo: [dpo] is read by task = 'dpo'; this job's task is 'sft'"),
        (MINIMAL.replace("[model]", 'task = "ppo"\n    [model]'), "task: got 'ppo', expected one of 'sft', 'dpo'"),
        (MINIMAL.replace('format = "alpaca"', 'format = "preference"'), "data.format: got 'preference' for task"),
        (DPO.replace('format = "preference"', 'format = "alpaca"'), "data.format: got 'alpaca' for task = 'dpo'"),
        (DPO.replace('path = "pairs.jsonl"', 'path = "org/pairs"'), "data.path: org/pairs: a DPO job reads a local"),
        (DPO + "    [dpo]\n    loss_type = ['sigmoid', 'ipo']\n    loss_weights = [1.0]\n",
         "dpo.loss_weights: got 1 weights for 2 loss types"),
        (DPO + "    [dpo]\n    sync_ref_model = true\n", "dpo.sync_ref_model: TR-DPO's reference sync is not built"),
    ],
)  # fmt: skip
def test_bad_dpo_jobs_name_the_key(tmp_path: Path, text: str, expected: str) -> None:
    """Each mistake of a DPO job (or an SFT job with DPO's parts) is named by its key."""
    write_pairs(tmp_path)
    found = problems(write_job(tmp_path, text))
    assert any(p.startswith(expected) for p in found), found
