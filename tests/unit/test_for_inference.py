"""Config.for_inference: the config of an engine without an optimizer, made from a training config by one rule.

Each step of the rule (``dsbuild.resolve.inference``) is checked on its own: the stage, the offload and its refusal,
the hidden-size "auto" values (against ``resolve``, which reads the same table), DeepCompile, what is removed and what
is kept; then provenance and ``explain`` (the library and the CLI), round trips, purity and idempotence. DeepSpeed's and
TRL's verdicts on the result are in ``tests/integration/test_for_inference_trl.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsbuild import AUTO, Config, ConfigError, presets
from dsbuild.cli import main
from dsbuild.errors import InvalidValueError
from dsbuild.resolve.explain import Explanation, render_explanation
from dsbuild.resolve.hf_table import FILLS
from dsbuild.resolve.inference import REMOVED, for_inference, removed_by_for_inference
from dsbuild.resolve.training import Training

BUCKETS = (
    "zero_optimization.reduce_bucket_size",
    "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_param_persistence_threshold",
)
"""The hidden-size "auto" keys: the fill table's rows that read no training argument, less the scheduler's."""

BATCH: dict[str, Any] = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4}


def training_config(stage: int | None, **zero: Any) -> Config:
    """A training config as RL scripts have them: AdamW with a schedule, bf16, clipping, optimizer states on CPU."""
    data: dict[str, Any] = {
        **BATCH,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-5, "weight_decay": 0.0}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}},
        "gradient_clipping": 1.0,
    }
    if stage is not None:
        offload = {"offload_optimizer": {"device": "cpu", "pin_memory": True}} if stage else {}
        data["zero_optimization"] = {"stage": stage, **offload, **zero}
    return Config.from_dict(data)


def get(data: dict[str, Any], path: str) -> Any:
    for key in path.split("."):
        data = data[key]
    return data


def has(data: dict[str, Any], path: str) -> bool:
    try:
        get(data, path)
    except KeyError:
        return False
    return True


# -- the stage -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("stage", "expected"), [(None, None), (0, 0), (1, 0), (2, 0), (3, 3)])
def test_stage_3_stays_and_every_lower_stage_runs_at_0(stage: int | None, expected: int | None) -> None:
    """DeepSpeed partitions parameters without an optimizer only at stage 3; below it, stage 0 (no stage stays none)."""
    zero = training_config(stage).for_inference().zero_optimization
    assert (None if zero is None else zero.stage) == expected


@pytest.mark.parametrize("stage", [1, 2])
def test_a_lowered_stage_quotes_deepspeeds_assertion(stage: int) -> None:
    """Explain names the rule and DeepSpeed's reason for the stage it changed; an unchanged stage keeps its origin."""
    origins = {e.path: e.origin for e in training_config(stage).for_inference().explain()}
    assert origins["zero_optimization.stage"] == (
        f'for_inference: DeepSpeed asserts "zero stage {stage} requires an optimizer"'
    )
    origins3 = {e.path: e.origin for e in Config.preset("zero3").batch(micro=1).for_inference().explain()}
    assert origins3["zero_optimization.stage"] == "preset zero3"


def test_a_stage_left_auto_is_refused() -> None:
    """The rule needs the training stage: "auto" (Accelerate's to fill) is an error naming the key, not a guess."""
    with pytest.raises(InvalidValueError) as caught:
        Config.zero(AUTO).for_inference()  # type: ignore[arg-type]  # zero() is typed for a number; a file may say "auto"
    assert str(caught.value) == (
        'zero_optimization.stage: got "auto", expected 0, 1, 2 or 3: for_inference keeps stage 3 and turns 0-2 into 0'
        ' (set the training stage; Accelerate fills "auto" from its zero_stage setting)'
    )


@pytest.mark.parametrize(("training", "stage"), [(3, 0), (None, 3), (1, 3), (2, 0), (3, 3), (0, 0)])
def test_the_engine_may_have_a_stage_of_its_own(training: int | None, stage: int) -> None:
    """``stage=0`` keeps a whole copy on every process beside a partitioned policy, ``stage=3`` partitions it beside
    a policy at 0-2 (a reward model's ``[rewards] zero_stage``); explain says so where it changed the stage, and the
    result still passes the checks for DeepSpeed."""
    inference = training_config(training).for_inference(hidden_size=64, stage=stage)
    data = inference.to_dict()
    assert data["zero_optimization"]["stage"] == stage
    origins = {e.path: e.origin for e in inference.explain()}
    if (training or 0) != stage:
        assert origins["zero_optimization.stage"] == f"for_inference: the engine's own stage (stage={stage})"
    resolved = inference.resolve(training=Training())
    assert [d for d in resolved.validate(target="deepspeed", resolved=True) if d.severity == "error"] == []
    whole = Config.preset("hf_zero3").for_inference(hidden_size=64, stage=0).resolve(training=Training())
    assert [d for d in whole.validate(target="deepspeed", resolved=True) if d.severity == "error"] == []


@pytest.mark.parametrize("stage", [1, 2, True, "3"])
def test_an_engine_stage_other_than_0_or_3_is_refused(stage: Any) -> None:
    """DeepSpeed builds an engine without an optimizer at stage 0 or 3 only: another ``stage`` names the key."""
    with pytest.raises(InvalidValueError) as caught:
        training_config(3).for_inference(stage=stage)
    assert str(caught.value).startswith(
        f"zero_optimization.stage: got {'true' if stage is True else repr(stage)} for the engine without an "
        "optimizer, expected 0 or 3"
    )


def test_offload_follows_the_engines_own_stage() -> None:
    """``offload=True`` needs the engine at stage 3: given ``stage=3`` beside a stage-2 policy it offloads; given
    ``stage=0`` beside a stage-3 one it is refused, saying why."""
    offloaded = training_config(2).for_inference(True, stage=3).to_dict()["zero_optimization"]["offload_param"]
    assert offloaded == {"device": "cpu", "pin_memory": True}
    with pytest.raises(InvalidValueError) as caught:
        training_config(3).for_inference(True, stage=0)
    assert "the engine is given stage=0" in str(caught.value)


# -- offload --------------------------------------------------------------------------------------------------------


def test_offload_puts_parameters_in_pinned_cpu_memory_at_stage_3() -> None:
    """offload=True writes OpenRLHF's offload_param (cpu, pinned), replacing an NVMe one whole."""
    expected = {"device": "cpu", "pin_memory": True}
    assert training_config(3).for_inference(True).to_dict()["zero_optimization"]["offload_param"] == expected
    nvme = Config.preset("zero3_nvme").batch(micro=1).for_inference(offload=True)
    assert nvme.to_dict()["zero_optimization"]["offload_param"] == expected
    origins = {e.path: e.origin for e in nvme.explain()}
    assert origins["zero_optimization.offload_param.device"] == (
        "for_inference: offload=True puts the parameters in pinned CPU memory between uses (OpenRLHF's eval config)"
    )


@pytest.mark.parametrize("stage", [None, 0, 1, 2])
def test_offload_is_refused_below_stage_3(stage: int | None) -> None:
    """Below stage 3 DeepSpeed ignores offload_param silently: asking for it is an error naming the key and the fix."""
    with pytest.raises(InvalidValueError) as caught:
        training_config(stage).for_inference(offload=True)
    assert str(caught.value) == (
        "zero_optimization.offload_param: offload=True writes {device: cpu, pin_memory: true} here, which needs ZeRO "
        f"stage 3; the training config has stage {stage or 0}, so the inference engine runs at stage 0, where "
        "DeepSpeed ignores offload_param (train at ZeRO stage 3 to offload the inference model's parameters, or call "
        "for_inference() without offload)"
    )


def test_without_offload_the_training_offload_param_is_kept() -> None:
    """offload=False changes nothing of offload_param: a ZeRO-3 config that offloads parameters gives one that does."""
    inference = Config.preset("zero3_offload").batch(micro=1).for_inference()
    assert inference.to_dict()["zero_optimization"]["offload_param"] == {"device": "cpu", "pin_memory": True}
    assert inference.provenance == {}


def test_bad_arguments_are_reported_together() -> None:
    """A wrong offload or hidden size fails at the call, each by its name, all at once."""
    with pytest.raises(InvalidValueError) as caught:
        training_config(3).for_inference(1, hidden_size=0)  # type: ignore[arg-type]
    assert str(caught.value) == (
        "2 problems:\n"
        "  offload: got 1, expected true or false (True puts the parameters in CPU memory (ZeRO stage 3); False keeps "
        "the training config's offload_param)\n"
        "  hidden_size: got 0, expected an integer > 0 (give the inference model's config.hidden_size)"
    )


# -- the hidden-size "auto" ---------------------------------------------------------------------------------------


def test_the_bucket_rows_are_the_fill_tables_rows_that_read_no_training_argument() -> None:
    """for_inference fills what the one table fills from the model alone: the three buckets (and the scheduler's
    warmup_min_lr, which it removes with the scheduler)."""
    rows = [fill.path for fill in FILLS if not fill.arguments_read]
    assert rows == ["scheduler.params.warmup_min_lr", *BUCKETS]


@pytest.mark.parametrize("hidden", [1, 64, 4096, 5120])
def test_bucket_autos_at_stage_3_are_what_resolve_gives(hidden: int) -> None:
    """The three "auto" buckets get the HF Trainer's values (resolve, one table) from the inference model's size."""
    train = training_config(3, **dict.fromkeys((p.split(".")[1] for p in BUCKETS), "auto"))
    inference = train.for_inference(hidden_size=hidden).to_dict()
    resolved = train.resolve(hidden_size=hidden).to_dict()
    assert [get(inference, p) for p in BUCKETS] == [get(resolved, p) for p in BUCKETS]
    assert [get(inference, p) for p in BUCKETS] == [hidden * hidden, int(0.9 * hidden * hidden), 10 * hidden]
    explained = {e.path: e.origin for e in train.for_inference(hidden_size=hidden).explain()}
    assert explained["zero_optimization.stage3_prefetch_bucket_size"] == (
        f"for_inference: hidden_size argument {hidden} (0.9 × hidden size²)"
    )


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_below_stage_3_reduce_bucket_is_filled_and_stage_3_buckets_removed(stage: int) -> None:
    """At stage 0 the HF rows fill reduce_bucket_size; the stage-3 "auto" buckets, which nothing fills or reads there,
    go (with or without a hidden size)."""
    train = training_config(stage, **dict.fromkeys((p.split(".")[1] for p in BUCKETS), "auto"))
    assert train.for_inference(hidden_size=8).to_dict()["zero_optimization"] == {"stage": 0, "reduce_bucket_size": 64}
    assert train.for_inference().to_dict()["zero_optimization"] == {"stage": 0, "reduce_bucket_size": "auto"}
    removed = [e.path for e in removed_by_for_inference(train)]
    assert removed[-2:] == list(BUCKETS[1:])


def test_without_hidden_size_the_autos_stay_for_resolve() -> None:
    """No hidden size: the "auto" buckets stay, and resolve(hidden_size=...) fills them later, without a step count
    (the scheduler is gone)."""
    inference = Config.preset("hf_zero3").for_inference()
    zero = inference.to_dict()["zero_optimization"]
    assert [zero[p.split(".")[1]] for p in BUCKETS] == ["auto"] * 3
    resolved = inference.resolve(training=Training(), hidden_size=16).to_dict()["zero_optimization"]
    assert [resolved[p.split(".")[1]] for p in BUCKETS] == [256, 230, 160]


def test_explicit_buckets_are_kept() -> None:
    """A bucket the config sets is the user's: hidden_size changes only "auto" (HF's fill_only)."""
    train = training_config(3, reduce_bucket_size=10, stage3_prefetch_bucket_size=20)
    zero = train.for_inference(hidden_size=64).to_dict()["zero_optimization"]
    assert (zero["reduce_bucket_size"], zero["stage3_prefetch_bucket_size"]) == (10, 20)


def test_other_autos_stay_for_resolve() -> None:
    """The batch sizes, precision and clipping "auto" need training arguments for_inference does not have."""
    inference = Config.preset("hf_zero2").for_inference(hidden_size=8).to_dict()
    assert inference["train_micro_batch_size_per_gpu"] == "auto" and inference["gradient_clipping"] == "auto"
    assert inference["bf16"] == {"enabled": "auto"}


# -- DeepCompile, removals, what is kept ----------------------------------------------------------------------------


@pytest.mark.parametrize(("given", "expected"), [(True, False), (AUTO, False), (False, False), (None, None)])
def test_deepcompile_is_turned_off(given: Any, expected: bool | None) -> None:
    """ZeRO inference has no DeepCompile mode: on or "auto" becomes false; off or unset stays."""
    compile_ = {"passes": ["z3"]} if given is None else {"deepcompile": given, "passes": ["z3"]}
    inference = training_config(3).set(compile=compile_).for_inference()
    assert inference.compile is not None and inference.compile.deepcompile is expected
    assert inference.compile.passes == ("z3",)


def training_only_config(stage: int) -> Config:
    """A training config setting every key REMOVED lists."""
    return Config.from_dict(
        {
            **BATCH,
            "bf16": {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True},
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-5}},
            "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}},
            "managed_gradient_accumulation": False,
            "zero_optimization": {
                "stage": stage,
                "offload_optimizer": {"device": "cpu"},
                "zenflow": {"topk_ratio": 0.1},
                "compute_grad_norm": False,
            },
        }
    )


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_every_key_only_an_optimizer_step_reads_is_removed_with_its_reason(stage: int) -> None:
    """Each REMOVED row goes (the fp16 one is checked with fp16 below) and says why, in the table's order."""
    train = training_only_config(stage)
    inference = train.for_inference().to_dict()
    rows = [r for r in REMOVED if not r.path.startswith("fp16.")]
    assert not any(has(inference, r.path) for r in rows)
    removed = removed_by_for_inference(train)
    assert [e.path for e in removed] == [r.path for r in rows]
    assert [e.origin for e in removed] == [f"for_inference: {r.why}" for r in rows]
    assert all(e.removed for e in removed)
    assert removed[0].value == {"type": "AdamW", "params": {"lr": 1e-5}}
    fp16 = Config.zero(1).fp16(fp16_master_weights_and_grads=True).batch(micro=1).for_inference()
    assert fp16.to_dict()["fp16"] == {"enabled": True}


def test_what_an_engine_without_an_optimizer_still_reads_is_kept() -> None:
    """Precision, the batch sizes, AutoTP, sequence parallelism, clipping and the other ZeRO keys stay as written."""
    train = training_config(2, overlap_comm=True, contiguous_gradients=True, allgather_bucket_size=int(2e8)).set(
        tensor_parallel={"autotp_size": 2}, sequence_parallel_size=2, train_batch_size=16, steps_per_print=5
    )
    inference = train.for_inference().to_dict()
    expected = train.to_dict()
    for key in ("optimizer", "scheduler"):
        del expected[key]
    del expected["zero_optimization"]["offload_optimizer"]
    expected["zero_optimization"]["stage"] = 0
    assert inference == expected


# -- provenance, explain, round trips, purity ----------------------------------------------------------------------


def test_provenance_of_kept_keys_survives_and_of_removed_keys_goes() -> None:
    """resolve's provenance stays for the keys still there; none is left for a key the rule removed."""
    resolved = Config.preset("hf_zero2").resolve(training=Training(), total_steps=100)
    inference = resolved.for_inference()
    assert inference.provenance["gradient_clipping"] == "training argument max_grad_norm"
    assert not any(path.startswith(("optimizer", "scheduler")) for path in inference.provenance)
    assert inference.source == resolved.source == "preset hf_zero2"


def test_explain_renders_the_changed_and_the_removed_keys() -> None:
    """What `dsbuild explain --for-inference` prints: each key's origin, then each removed key and why."""
    train = training_config(2).zero_options(reduce_bucket_size=AUTO)
    rows = train.for_inference(hidden_size=8).explain() + removed_by_for_inference(train)
    assert render_explanation(rows).splitlines() == [
        "train_micro_batch_size_per_gpu        2          set by the user",
        "gradient_accumulation_steps           4          set by the user",
        "bf16.enabled                          true       set by the user",
        'zero_optimization.stage               0          for_inference: DeepSpeed asserts "zero stage 2 requires an'
        ' optimizer"',
        "zero_optimization.reduce_bucket_size  64         for_inference: hidden_size argument 8 (hidden size²)",
        "gradient_clipping                     1.0        set by the user",
        f"optimizer                             (removed)  for_inference: {REMOVED[0].why}",
        f"scheduler                             (removed)  for_inference: {REMOVED[1].why}",
        f"zero_optimization.offload_optimizer   (removed)  for_inference: {REMOVED[2].why}",
    ]
    assert str(rows[-1]) == f"zero_optimization.offload_optimizer removed  (for_inference: {REMOVED[2].why})"
    assert Explanation("a", 1, "x") == Explanation("a", 1, "x", removed=False)


def test_the_cli_explains_the_inference_config(capsys: pytest.CaptureFixture[str]) -> None:
    """`dsbuild explain CONFIG --for-inference` prints the inference config of the resolved config with the keys the
    rule removed; without the flag nothing is removed."""
    argv = ["explain", "hf_zero3", "--for-inference", "--hidden-size", "64", "--total-steps", "10"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("optimizer ") and "(removed)" in line for line in lines)
    assert any(line.startswith("zero_optimization.stage ") and line.split()[1] == "3" for line in lines)
    assert main(["explain", "hf_zero3", "--hidden-size", "64", "--total-steps", "10"]) == 0
    assert "(removed)" not in capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(presets()))
def test_every_preset_gives_an_inference_config_deepspeed_would_take(name: str) -> None:
    """Each packaged preset, made an inference config and resolved, passes dsbuild's checks for DeepSpeed with no
    "auto" left, and reads back equal from its dict."""
    train = Config.preset(name)
    if train.train_micro_batch_size_per_gpu is None:
        train = train.batch(micro=2)
    inference = train.for_inference(hidden_size=64)
    assert Config.from_dict(inference.to_dict()) == inference
    resolved = inference.resolve(training=Training())
    assert [d for d in resolved.validate(target="deepspeed", resolved=True) if d.severity == "error"] == []


STAGES = st.sampled_from([None, 0, 1, 2, 3])
SETTINGS = st.fixed_dictionaries(
    {},
    optional={
        "offload_optimizer": st.just({"device": "cpu"}),
        "offload_param": st.just({"device": "cpu"}),
        "reduce_bucket_size": st.sampled_from(["auto", 1000]),
        "stage3_prefetch_bucket_size": st.sampled_from(["auto", 1000]),
        "stage3_param_persistence_threshold": st.sampled_from(["auto", 1000]),
        "overlap_comm": st.booleans(),
        "compute_grad_norm": st.booleans(),
    },
)


@settings(max_examples=60)
@given(
    stage=STAGES, zero=SETTINGS, hidden=st.none() | st.integers(1, 8192), precision=st.sampled_from(["bf16", "fp16"])
)
def test_the_rule_is_pure_idempotent_and_round_trips(
    stage: int | None, zero: dict[str, Any], hidden: int | None, precision: str
) -> None:
    """For any stage and ZeRO keys: the training config is unchanged, the result reads back equal from its dict, is
    its own inference config, and holds no optimizer, no optimizer offload and stage 0 or 3 (or none)."""
    data: dict[str, Any] = {**BATCH, precision: {"enabled": True}, "optimizer": {"type": "Adam", "params": {}}}
    if stage is not None:
        data["zero_optimization"] = {"stage": stage, **zero}
    train = Config.from_dict(data)
    before = train.to_dict()
    offload = stage == 3
    inference = for_inference(train, offload, hidden_size=hidden)
    assert train.to_dict() == before
    out = inference.to_dict()
    assert Config.from_dict(out) == inference
    assert for_inference(inference, offload, hidden_size=hidden) == inference
    assert "optimizer" not in out and not has(out, "zero_optimization.offload_optimizer")
    assert get(out, "zero_optimization.stage") in (0, 3) if stage is not None else "zero_optimization" not in out
    if hidden is not None:
        assert "auto" not in str(out)


def test_the_config_class_is_kept() -> None:
    """Delegation passes the class down: a Config subclass gets its own class back (the layers below never import
    the façade)."""

    class Mine(Config):
        __slots__ = ()

    assert type(Mine.from_dict({**BATCH, "zero_optimization": {"stage": 2}}).for_inference()) is Mine


def test_config_errors_are_value_errors() -> None:
    """The refusal is a ConfigError (a ValueError), as every config error is."""
    with pytest.raises(ConfigError):
        training_config(2).for_inference(offload=True)
    with pytest.raises(ValueError):
        training_config(2).for_inference(offload=True)
