"""``dsbuild import trl`` held against TRL 1.16 and Accelerate 1.15 themselves: the ds_config of a job imported with
an Accelerate config is the one Accelerate's own ``DeepSpeedPlugin`` builds from the environment ``accelerate launch``
gives it (TRL's shipped ``zero1/2/3.yaml`` and generated plugin settings), and the job's training arguments, data
keys and LoRA are the values TRL's own ``SFTConfig`` / ``ModelConfig`` hold for the same YAML (generated keys)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsbuild.job import Job
from dsbuild.job.accelerate_import import plugin_config
from dsbuild.job.trl_import import import_job, trl_arguments

pytestmark = pytest.mark.train  # TRL's parser and configs import torch and transformers

SHIPPED = Path(__import__("trl").__file__).parent / "accelerate_configs"
SFT = {"model_name_or_path": "Qwen/Qwen2-0.5B", "dataset_name": "trl-lib/Capybara"}


def _accelerate_env(config_file: Path) -> dict[str, str]:
    """The ``ACCELERATE_*`` environment ``accelerate launch --config_file`` gives the training processes."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env

    parsed = launch_command_parser().parse_args(["--config_file", str(config_file), "train.py"])
    parsed, _, _ = _validate_launch_command(parsed)
    parsed.deepspeed_fields_from_accelerate_config = ""  # launch_command sets it before the launcher runs
    _, env = prepare_deepspeed_cmd_env(parsed)
    return {k: v for k, v in env.items() if k.startswith("ACCELERATE_")}


def _accelerate_ds_config(config_file: Path, bf16: bool, fp16: bool) -> dict[str, Any]:
    """Accelerate's ``DeepSpeedPlugin``'s ds_config in that environment, its precision set as ``TrainingArguments``
    sets it (``fp16``, else ``bf16``, else ``ACCELERATE_MIXED_PRECISION``)."""
    from accelerate.utils import DeepSpeedPlugin

    env = _accelerate_env(config_file)
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        plugin = DeepSpeedPlugin()
        plugin.set_mixed_precision("fp16" if fp16 else "bf16" if bf16 else env.get("ACCELERATE_MIXED_PRECISION", "no"))
        return _plain(plugin.deepspeed_config)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if v is not None and k != "steps_per_print"}
    return value


def _imported(trl: dict[str, Any], accelerate: Path | None, tmp: Path, data_format: str = "messages") -> Any:
    settings_ = yaml.safe_load(accelerate.read_text()) if accelerate is not None else None
    return import_job(trl_arguments("sft", trl, "trl.yaml"), settings_, data_format=data_format, cwd=tmp)


@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("precision", [{}, {"fp16": True}, {"bf16": False}])
def test_shipped_configs_give_accelerates_ds_config(stage: int, precision: dict[str, bool], tmp_path: Path) -> None:
    """TRL's zero1/2/3.yaml: the job's [strategy] config is the DeepSpeedPlugin's, whatever decides the precision."""
    shipped = SHIPPED / f"zero{stage}.yaml"
    imported = _imported({**SFT, **precision}, shipped, tmp_path)
    bf16, fp16 = precision.get("bf16", not precision.get("fp16", False)), precision.get("fp16", False)
    assert imported.job["strategy"]["config"] == _accelerate_ds_config(shipped, bf16, fp16)
    assert imported.job["launch"] == {"nproc_per_node": 8, "nnodes": 1}
    job = Job.from_dict(imported.job, base_dir=tmp_path)
    assert job.config.zero_optimization is not None and job.config.zero_optimization.stage == stage


_SETTING = {
    "zero_stage": st.sampled_from([0, 1, 2, 3]),
    "offload_optimizer_device": st.sampled_from(["none", "cpu", "nvme"]),
    "offload_param_device": st.sampled_from(["none", "cpu", "nvme"]),
    "offload_optimizer_nvme_path": st.just("/local_nvme"),
    "zero3_init_flag": st.booleans(),
    "zero3_save_16bit_model": st.booleans(),
    "gradient_accumulation_steps": st.one_of(st.integers(1, 16), st.just("auto")),
    "gradient_clipping": st.one_of(st.sampled_from([0.0, 0.5, 1.0, 2.5]), st.just("auto")),
}


@st.composite
def _plugin_settings(draw: st.DrawFn) -> dict[str, Any]:
    keys = draw(st.lists(st.sampled_from(sorted(_SETTING)), unique=True))
    return {key: draw(_SETTING[key]) for key in keys}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    plugin=_plugin_settings(),
    mixed=st.sampled_from(["no", "bf16", "fp16"]),
    trainer=st.sampled_from([{}, {"fp16": True}, {"bf16": False}, {"bf16": True}]),
    counts=st.sampled_from([(1, 1), (4, 1), (8, 2)]),
)
def test_generated_plugin_settings_give_accelerates_ds_config(
    plugin: dict[str, Any], mixed: str, trainer: dict[str, bool], counts: tuple[int, int], tmp_path: Path
) -> None:
    """Generated deepspeed_config settings, mixed precision and counts: the DeepSpeedPlugin's ds_config, and the
    processes a node of the job's [launch]."""
    config = {"distributed_type": "DEEPSPEED", "mixed_precision": mixed, "num_processes": counts[0],
              "num_machines": counts[1], "deepspeed_config": plugin}  # fmt: skip
    path = tmp_path / "accelerate.yaml"
    path.write_text(yaml.safe_dump(config))
    imported = _imported({**SFT, **trainer}, path, tmp_path)
    bf16, fp16 = trainer.get("bf16", not trainer.get("fp16", False)), trainer.get("fp16", False)
    assert imported.job["strategy"]["config"] == _accelerate_ds_config(path, bf16, fp16)
    assert imported.job["launch"] == {"nproc_per_node": counts[0] // counts[1], "nnodes": counts[1]}
    keys = {n.key for n in imported.notes if n.file == "accelerate"}
    assert keys == {*config.keys() - {"deepspeed_config"}, *(f"deepspeed_config.{k}" for k in plugin)}


_DS_FILES = [
    {"zero_optimization": {"stage": "auto", "offload_optimizer": {"device": "auto"}}, "bf16": {"enabled": "auto"}},
    {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}, "gradient_accumulation_steps": "auto"},
    {"zero_optimization": {"stage": 1}, "fp16": {"enabled": "auto"}, "gradient_clipping": 0.5},
]


@pytest.mark.parametrize("ds", _DS_FILES)
@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_file_with_an_accelerate_config(ds: dict[str, Any], stage: int, tmp_path: Path) -> None:
    """--deepspeed DS.json under TRL's zero2/3.yaml: the plugin's ds_config from that file, in the environment
    accelerate launch gives it, the precision the trainer's (bf16)."""
    from accelerate.utils import DeepSpeedPlugin

    shipped = SHIPPED / f"zero{stage}.yaml"
    imported = import_job(trl_arguments("sft", SFT, "trl.yaml"), yaml.safe_load(shipped.read_text()), ds,
                          data_format="messages", cwd=tmp_path)  # fmt: skip
    saved = dict(os.environ)
    os.environ.update(_accelerate_env(shipped))
    try:
        plugin = DeepSpeedPlugin(hf_ds_config=json.loads(json.dumps(ds)))
        plugin.set_mixed_precision("bf16")
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert imported.job["strategy"]["config"] == _plain(plugin.deepspeed_config)


@pytest.mark.parametrize("ds", _DS_FILES)
def test_an_accelerate_config_naming_a_ds_config_file(ds: dict[str, Any], tmp_path: Path) -> None:
    """An Accelerate config with deepspeed_config_file (what export --for trl writes): the plugin reads the file from
    ACCELERATE_DEEPSPEED_CONFIG_FILE; the import reads the same file into the same ds_config."""
    (tmp_path / "ds.json").write_text(json.dumps(ds))
    config = {"distributed_type": "DEEPSPEED", "num_processes": 2, "num_machines": 1,
              "deepspeed_config": {"deepspeed_config_file": str(tmp_path / "ds.json"), "zero3_init_flag": False}}  # fmt: skip
    path = tmp_path / "accelerate.yaml"
    path.write_text(yaml.safe_dump(config))
    imported = import_job(trl_arguments("sft", SFT, "trl.yaml"), config, ds, data_format="messages", cwd=tmp_path)
    assert imported.job["strategy"]["config"] == _accelerate_ds_config(path, True, False)


def test_every_key_of_accelerates_config_is_known() -> None:
    """Each field of Accelerate's ClusterConfig is carried or has a row saying when it changes nothing (a newer
    Accelerate's key fails here, not as 'not a key of Accelerate's config')."""
    from accelerate.commands.config.config_args import ClusterConfig

    from dsbuild.job.accelerate_import import AT_DEFAULT

    carried = {"distributed_type", "deepspeed_config", "mixed_precision", "num_processes", "num_machines", "gpu_ids"}
    assert {f.name for f in dataclasses.fields(ClusterConfig)} - carried == set(AT_DEFAULT)


def test_a_ds_config_file_is_filled_as_accelerate_fills_it(tmp_path: Path) -> None:
    """A ds_config file with "auto" stage and offload: filled from the Accelerate settings as the plugin fills it."""
    from accelerate.utils import DeepSpeedPlugin

    ds = {"zero_optimization": {"stage": "auto", "offload_optimizer": {"device": "auto"}}, "bf16": {"enabled": "auto"}}
    ours = plugin_config({"zero_stage": 3, "offload_optimizer_device": "cpu"}, "bf16", ds)
    saved = dict(os.environ)
    os.environ.update({"ACCELERATE_DEEPSPEED_ZERO_STAGE": "3", "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": "cpu"})
    try:
        plugin = DeepSpeedPlugin(hf_ds_config=dict(ds))
        plugin.set_mixed_precision("bf16")
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert ours == _plain(plugin.deepspeed_config)


_TRAINING_KEYS = {
    "learning_rate": st.sampled_from(["2e-5", "1.0e-4", 3e-4]),  # a YAML 2e-5 is a string: TRL's parser makes it float
    "per_device_train_batch_size": st.integers(1, 8),
    "gradient_accumulation_steps": st.integers(1, 8),
    "num_train_epochs": st.sampled_from([1, 2.5]),
    "max_steps": st.sampled_from([-1, 10]),
    "warmup_steps": st.sampled_from([0, 5, 0.1]),
    "lr_scheduler_type": st.sampled_from(["linear", "cosine", "constant"]),
    "weight_decay": st.sampled_from([0.0, 0.01]),
    "max_grad_norm": st.sampled_from([1.0, 0.3]),
    "seed": st.integers(0, 100),
    "logging_steps": st.sampled_from([1, 10, 50]),
    "gradient_checkpointing": st.booleans(),
    "bf16": st.booleans(),
    "save_steps": st.sampled_from([100, 500]),
    "max_length": st.sampled_from([128, 1024, 2048]),
    "packing": st.booleans(),
    "padding_free": st.booleans(),
    "completion_only_loss": st.sampled_from([None, True, False]),
    "assistant_only_loss": st.booleans(),
    "use_peft": st.booleans(),
    "lora_r": st.sampled_from([4, 16]),
    "lora_alpha": st.sampled_from([8, 32]),
    "lora_dropout": st.sampled_from([0.0, 0.1]),
    "lora_target_modules": st.sampled_from([["q_proj", "v_proj"], "all-linear"]),
    "dtype": st.sampled_from(["bfloat16", "float32", "auto"]),
    # keys a job does not run: each said, at TRL's default or not
    "push_to_hub": st.booleans(),
    "optim": st.sampled_from(["adamw_torch", "sgd"]),
    "loss_type": st.sampled_from(["nll", "dft"]),
    "activation_offloading": st.booleans(),
    "use_dora": st.booleans(),
    "dataset_streaming": st.booleans(),
    "not_a_trl_key": st.just(1),
}


@st.composite
def _trl_config(draw: st.DrawFn) -> dict[str, Any]:
    keys = draw(st.lists(st.sampled_from(sorted(_TRAINING_KEYS)), unique=True))
    return {**SFT, **{key: draw(_TRAINING_KEYS[key]) for key in keys}}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(config=_trl_config())
def test_generated_trainer_keys_are_what_trl_runs(config: dict[str, Any], tmp_path: Path) -> None:
    """The job's [training] (as the job reads it), [data] and [model.lora] hold the values TRL's SFTConfig and
    get_peft_config(ModelConfig) have for the same YAML."""
    from trl import get_peft_config
    from trl.scripts.sft import make_parser

    if config.get("packing") and config.get("padding_free") is False:
        config.pop("padding_free")
    imported = _imported(config, None, tmp_path)
    assert {n.key for n in imported.notes} == set(config)  # every key carried, of no effect, or not carried
    for note in imported.of("not carried"):
        assert note.why and note.value == config[note.key]
    job = Job.from_dict(imported.job, base_dir=tmp_path)
    parser = make_parser()
    config.pop("not_a_trl_key", None)
    parser.set_defaults_with_config(**config, use_cpu=True)  # CPU here: TrainingArguments refuses bf16 without it
    _, trainer, model, _ = parser.parse_args_into_dataclasses(args=[])
    for field in attrs.fields(type(job.training)):
        if field.name in ("given", "problems", "missing", "output_dir") or not hasattr(trainer, field.name):
            continue  # warmup_ratio: transformers 5 reads a warmup_steps below 1 as the ratio
        ours, theirs = getattr(job.training, field.name), getattr(trainer, field.name)
        theirs = getattr(theirs, "value", theirs)
        if field.name == "report_to":  # HF holds "none" as []
            ours, theirs = set(ours) - {"none"}, set(theirs)
        assert ours == theirs, field.name
    for key in ("max_length", "packing", "padding_free", "completion_only_loss", "assistant_only_loss"):
        assert getattr(job.data, key) == getattr(trainer, key), key
    peft = get_peft_config(model)
    assert (job.model.lora is None) == (peft is None)
    if peft is not None and job.model.lora is not None:
        lora = job.model.lora.to_peft()
        assert (lora["r"], lora["lora_alpha"], lora["lora_dropout"]) == (peft.r, peft.lora_alpha, peft.lora_dropout)
        target = peft.target_modules
        ours = lora.get("target_modules")
        assert (set(ours) if isinstance(ours, list) else ours) == (set(target) if isinstance(target, set) else target)
    assert job.model.dtype == model.dtype


@pytest.mark.parametrize("task", ["sft", "dpo", "grpo"])
def test_every_field_of_trls_dataclasses_has_a_rule(task: str, tmp_path: Path) -> None:
    """Every field of the task's ScriptArguments, ModelConfig, DatasetMixtureConfig and trainer config (its own, not
    HF's), set to TRL's default, is said by a rule of its own: none falls to the catch-all (a newer TRL's key fails
    here)."""
    from transformers import TrainingArguments
    from trl.scripts import dpo, grpo, sft

    from dsbuild.job.trl_import import NOT_READ

    hf = {f.name for f in dataclasses.fields(TrainingArguments)}  # HF's names: one rule (NOT_TAKEN or [training])
    parser = {"sft": sft, "dpo": dpo, "grpo": grpo}[task].make_parser()
    config: dict[str, Any] = {}
    for cls in parser.dataclass_types:
        for f in dataclasses.fields(cls):
            if f.name in hf:
                continue
            if f.init and f.default is not dataclasses.MISSING:
                config[f.name] = f.default
            elif f.init and f.default_factory is not dataclasses.MISSING:
                config[f.name] = f.default_factory()
    config.update(SFT, reward_funcs=["my_rewards.length"])
    imported = import_job(trl_arguments(task, config, "trl.yaml"), None, data_format="text", cwd=tmp_path)
    caught = [n.key for n in imported.notes if n.why in (NOT_READ, f"not a key of a {task} job")]
    assert caught == []
    assert {n.key for n in imported.notes} == set(config)  # and every key is said


_RL_KEYS = {
    "dpo": {
        "beta": st.sampled_from([0.1, 0.5]),
        "loss_type": st.sampled_from([["sigmoid"], ["ipo"], ["sigmoid", "sft"]]),
        "label_smoothing": st.sampled_from([0.0, 0.1]),
        "max_length": st.sampled_from([256, 1024]),
        "truncation_mode": st.sampled_from(["keep_start", "keep_end"]),
        "disable_dropout": st.booleans(),
        "precompute_ref_log_probs": st.booleans(),
        "learning_rate": st.sampled_from(["5e-7", 1e-6]),
    },
    "grpo": {
        "num_generations": st.sampled_from([2, 4]),
        "max_completion_length": st.sampled_from([64, 256]),
        "temperature": st.sampled_from([0.7, 1.0]),
        "top_p": st.sampled_from([0.9, 1.0]),
        "beta": st.sampled_from([0.0, 0.04]),
        "epsilon": st.sampled_from([0.2, 0.3]),
        "loss_type": st.sampled_from(["grpo", "dapo", "dr_grpo"]),
        "scale_rewards": st.sampled_from(["group", "batch", "none"]),
        "mask_truncated_completions": st.booleans(),
        "reward_weights": st.sampled_from([None, [0.5]]),
    },
}


@st.composite
def _rl_config(draw: st.DrawFn, task: str) -> dict[str, Any]:
    keys = draw(st.lists(st.sampled_from(sorted(_RL_KEYS[task])), unique=True))
    config = {**SFT, "per_device_train_batch_size": 8, **{key: draw(_RL_KEYS[task][key]) for key in keys}}
    if task == "grpo":
        config["reward_funcs"] = ["my_rewards.length"]
    return config


@pytest.mark.parametrize("task", ["dpo", "grpo"])
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_generated_dpo_and_grpo_keys_are_what_trl_runs(task: str, data: st.DataObject, tmp_path: Path) -> None:
    """The job's [dpo] / [grpo] (and [reference] precompute, [rewards] weights) read back as the spec of the
    DPOConfig / GRPOConfig TRL builds from the same generated YAML; every key said."""
    from trl.scripts import dpo, grpo

    from dsbuild.job.rl import DPOSpec, GRPOSpec

    config = data.draw(_rl_config(task))
    imported = import_job(trl_arguments(task, config, "trl.yaml"), None, cwd=tmp_path)
    assert {n.key for n in imported.notes} == set(config)
    parser = {"dpo": dpo, "grpo": grpo}[task].make_parser()
    parser.set_defaults_with_config(**config, use_cpu=True)
    _, trainer, _, _ = parser.parse_args_into_dataclasses(args=[])
    spec = {"dpo": DPOSpec, "grpo": GRPOSpec}[task]
    table = dict(imported.job[task])
    if task == "dpo":
        assert imported.job.get("reference", {}).get("precompute", False) == trainer.precompute_ref_log_probs
        table["precompute_ref_log_probs"] = trainer.precompute_ref_log_probs  # a job's [reference] precompute
    else:
        assert imported.job["rewards"].get("weights") == trainer.reward_weights
        # GRPOConfig fills an unset steps_per_generation with the accumulation, as a job reads an unset one
        table.setdefault("steps_per_generation", trainer.gradient_accumulation_steps)
    assert spec.from_trl(table) == spec.from_trl(trainer)
    assert imported.job["training"].get("learning_rate", 5e-5) == trainer.learning_rate
