"""``dsbuild plan`` and ``dsbuild doctor``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from .args import Commands, positive_int
from .output import error, out

if TYPE_CHECKING:
    from ..job import Job
    from ..planner import Plan, Precision

__all__ = ["add_checkpoints", "add_doctor", "add_plan"]


def add_checkpoints(commands: Commands) -> None:
    p = commands.add_parser(
        "checkpoints",
        help="list a run's checkpoints and verify each against its manifest",
        description=(
            "List the checkpoints of a run (its output folder, its checkpoints folder, or its job file), newest "
            "first, with step, time and size, and verify every file of each against its manifest (size and "
            "SHA-256). Exit 0: every checkpoint verifies; 1: one does not; 2: no checkpoints there."
        ),
    )
    p.add_argument(
        "where", metavar="OUTPUT_DIR|JOB", help="a run's output folder (or its checkpoints folder, or its job)"
    )
    p.set_defaults(handler=_checkpoints)


def _checkpoints(args: argparse.Namespace) -> int:
    from ..outputs import manifest
    from ..outputs.run_folder import RunFolder
    from .common import job_of

    where = Path(args.where)
    if where.is_file():
        job = job_of(args.where, [])
        if job is None:
            error(f"{where}: not a job file; give a run's output folder")
            return 2
        where = job.output_dir
    folder = RunFolder(where).checkpoints if RunFolder(where).checkpoints.is_dir() else where
    found = manifest.list_checkpoints(folder)
    if not found:
        error(f"{folder}: no checkpoints")
        return 2
    rows = [("tag", "step", "saved", "size", "")]
    for c in found:
        status = "ok" if c.problem is None else f"DAMAGED: {c.problem}"
        rows.append(
            (c.tag + (" (latest)" if c.latest else ""), str(c.step or "-"), c.saved_at or "-", _size(c.size), status)
        )
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    out(f"{folder}")
    for r in rows:
        out("  " + "  ".join(r[i].ljust(widths[i]) for i in range(4)) + "  " + r[4])
    return 1 if any(c.problem for c in found) else 0


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def add_plan(commands: Commands) -> None:
    p = commands.add_parser(
        "plan",
        help="which ZeRO stage and offload fit your GPUs",
        description=(
            "Memory per GPU and per node for every ZeRO stage and offload choice, and the fastest choice that "
            "fits. Each GPU needs its model states (DeepSpeed's own estimators), the activations of one "
            "micro-batch (from the model's shape: give --model) and a headroom for the CUDA context and "
            "fragmentation. Sizes: GiB is 2**30 bytes, GB 10**9."
        ),
    )
    size = p.add_mutually_exclusive_group(required=True)
    size.add_argument("--params", metavar="N", help="parameter count, e.g. 7B, 1.5B, 350M")
    size.add_argument(
        "--model",
        metavar="PATH",
        help="an HF model directory or its config.json (counted, not loaded), or a job file: its model (LoRA "
        "planned as LoRA), sequence length, micro-batch, checkpointing and processes",
    )
    p.add_argument(
        "--largest-layer-params", metavar="N", help="parameters of the largest layer (default: from --model)"
    )
    p.add_argument(
        "--gpus-per-node", type=positive_int, metavar="N", help="default 1, or a job's launch.nproc_per_node"
    )
    p.add_argument("--nodes", type=positive_int, metavar="N", help="default 1, or a job's launch.nnodes")
    p.add_argument("--gpu-memory", metavar="SIZE", help="memory per GPU, e.g. 80GiB or 81920MiB (as nvidia-smi shows)")
    p.add_argument("--cpu-memory", metavar="SIZE", help="CPU memory per node, e.g. 512GiB")
    p.add_argument("--seq-len", type=positive_int, metavar="N", help="tokens per sequence (default: 2048)")
    p.add_argument("--micro-batch", type=positive_int, metavar="N", help="sequences per GPU per step (default: 1)")
    p.add_argument(
        "--gradient-checkpointing",
        action=argparse.BooleanOptionalAction,
        help="activations with full recomputation, as HF gradient_checkpointing (default: on)",
    )
    p.add_argument(
        "--flash-attention",
        action="store_true",
        help="the attention kernel keeps no seq x seq scores (FlashAttention, SDPA's flash backend)",
    )
    p.add_argument(
        "--headroom",
        metavar="SIZE|PCT%",
        help="GPU memory kept free for the CUDA context and fragmentation: a size, a percent or both "
        "(default: 2GiB+10%%)",
    )
    p.add_argument(
        "--nvme",
        metavar="PATH",
        help="a directory on a local NVMe drive: NVMe offload rows may be recommended (default: they are not)",
    )
    p.add_argument(
        "--reference", action="store_true",
        help="count a frozen reference model beside the policy (DPO, GRPO's KL; a DPO job's --model: from its job)",
    )  # fmt: skip
    p.add_argument(
        "--precision",
        choices=("bf16", "fp16", "fp32"),
        help="the training precision the model states are counted in (default: bf16, or a job's as its run resolves it)",
    )
    p.add_argument(
        "--optimizer",
        metavar="NAME",
        help="the optimizer whose states are counted: AdamW, Adam, Lamb (2 a parameter), Lion, Adagrad, SGD (1) "
        "(default: AdamW, or a job's)",
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--emit", metavar="FILE", type=Path, help="write the recommended config as TOML (or JSON by suffix)")
    p.set_defaults(handler=_plan)


def _plan(args: argparse.Namespace) -> int:
    import attrs

    from ..planner import MIXED_ADAM, format_plan_table, parse_count, plan, plan_to_json, with_staging
    from ..planner.count import count_scorer
    from ..resolve.batch import degrees
    from .common import job_of

    model, lora, precision = args.model, None, MIXED_ADAM
    facts: dict[str, Any] = {"gpus_per_node": 1, "nodes": 1}
    job = job_of(args.model, []) if args.model is not None else None
    if job is not None:  # a job: its model (LoRA as LoRA), its shapes and its processes, unless the flags say
        model = dict(job.model.config) if job.model.config is not None else job.model.name_or_path
        lora = job.model.lora.to_peft() if job.model.lora is not None else None
        facts = {
            "gpus_per_node": job.launch.nproc_per_node,
            "nodes": job.launch.nnodes,
            "seq_len": job.data.max_length,
            "micro_batch": job.training.per_device_train_batch_size,
            "gradient_checkpointing": job.model.gradient_checkpointing,
            "sequence_parallel": degrees(job.config)[0],
        }
        facts.update(job.task_shapes())  # what the task keeps and feeds beside the policy (a reference, pairs)
        precision = _job_precision(job)
    if args.precision is not None or args.optimizer is not None:  # the flags win over the job's
        precision = attrs.evolve(
            precision,
            training=args.precision or precision.training,
            optimizer=args.optimizer or precision.optimizer,
            states=None if args.optimizer is not None else precision.states,
        )
    given = {
        "gpus_per_node": args.gpus_per_node,
        "nodes": args.nodes,
        "seq_len": args.seq_len,
        "micro_batch": args.micro_batch,
        "gradient_checkpointing": args.gradient_checkpointing,
    }
    facts.update({name: value for name, value in given.items() if value is not None})  # else the job's, or the default
    if args.reference:
        facts["reference"] = True
    roles = {key: facts.pop(key) for key in _ROLES if key in facts}  # what the task keeps beside the policy
    params = parse_count(args.params) if args.params is not None else None
    if roles.get("scorer") and params is None:  # a reward model: the decoder and a score head, no LM head
        params = count_scorer(model)
    result = plan(
        params=params,
        model=model,
        largest_layer_params=(
            parse_count(args.largest_layer_params, "largest_layer_params") if args.largest_layer_params else None
        ),
        gpu_memory=args.gpu_memory,
        cpu_memory=args.cpu_memory,
        flash_attention=args.flash_attention,
        headroom=args.headroom,
        nvme_path=args.nvme,
        lora=lora,
        precision=precision,
        **facts,
    )
    if roles.get("reward_models"):
        result = _with_reward_models(result, roles)
    if job is not None and job.training.async_save:  # each process's checkpoint copied into CPU memory as it saves
        from ..planner.count import count_lora

        result = with_staging(result, count_lora(model, lora) if lora is not None else result.params)
    out(json.dumps(plan_to_json(result), indent=2) if args.json else format_plan_table(result))
    if args.emit is not None:
        if result.recommended is None:
            error(f"nothing to write to {args.emit}: {result.reason}")
            return 1
        written = (
            result.recommended.to_json(args.emit)
            if args.emit.suffix == ".json"
            else result.recommended.to_toml(args.emit)
        )
        if not args.json:
            out(f"wrote {written}")
    return 0


_ROLES = ("scorer", "reward_models", "reward_stage", "reward_offload")
"""The facts of ``Job.task_shapes`` that are no argument of ``plan``: a reward task's model (a scorer), a GRPO or
RLOO job's reward models (their folders, ZeRO stage and offload)."""


def _with_reward_models(result: Plan, roles: dict[str, Any]) -> Plan:
    """The plan with a GRPO or RLOO job's reward models counted (each a scorer read from its folder); one whose
    config cannot be read (a hub id: nothing is downloaded) is a note, not counted."""
    import attrs

    from ..errors import InvalidValueError
    from ..planner.count import count_scorer
    from ..planner.frozen import with_frozen_models

    counted, notes = [], []
    for where in roles["reward_models"]:
        try:
            counted.append(count_scorer(where))
        except InvalidValueError as e:
            notes.append(f"reward model {where} not counted: {e.problems[0].message}")
    result = with_frozen_models(result, counted, roles.get("reward_stage"), bool(roles.get("reward_offload")))
    return attrs.evolve(result, notes=(*result.notes, *notes))


def _job_precision(job: Job) -> Precision:
    """The precision, model dtype and optimizer a job's run trains with: its config resolved as the run resolves it
    (``bf16``/``fp16`` from ``[training]`` or the config), the facts the run learns later left waiting."""
    from ..planner import Precision
    from ..resolve.resolution import resolve

    try:
        resolved = resolve(
            job.config, world_size=job.launch.world_size, training=job.training, hidden_size=job.model.hidden_size,
            waiting_for=("hidden_size", "total_steps"),
        )  # fmt: skip
    except ConfigError as e:
        error = e.prefixed("strategy.config")
        raise error.with_source(job.source) if job.source else error from None
    return Precision.of(resolved, job.model.dtype)


def add_doctor(commands: Commands) -> None:
    p = commands.add_parser(
        "doctor",
        help="versions, accelerator, and the ops a config needs",
        description=(
            "Report the versions of Python, torch, DeepSpeed, transformers, peft and accelerate, the accelerator "
            "DeepSpeed will use, and whether the ops a config needs are built or can be compiled here. "
            "Exit 1 when something the config needs is missing."
        ),
    )
    p.add_argument(
        "config", nargs="?", metavar="CONFIG_OR_JOB", help="a config file, preset or job file to check against"
    )
    p.set_defaults(handler=_doctor)


def _doctor(args: argparse.Namespace) -> int:
    from ..env.doctor import render_report, report
    from .common import load_ref

    config = load_ref(args.config, lenient=True) if args.config is not None else None
    result = report(config)
    out(render_report(result))
    return 0 if result.ok else 1
