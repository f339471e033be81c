"""``dsbuild plan``: the activations and headroom options, sizes in GB and GiB, and issue 12's 70B example."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dsbuild.cli import main

LLAMA_3_70B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``main(argv)`` in-process: exit code, stdout, stderr."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


@pytest.fixture
def llama70b(tmp_path: Path) -> Path:
    """A model directory holding Llama-3-70B's config.json (no weights)."""
    folder = tmp_path / "llama70b"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA_3_70B), encoding="utf-8")
    return folder


def test_the_70b_example_recommends_what_fits_after_activations_and_headroom(
    capsys: pytest.CaptureFixture[str], llama70b: Path
) -> None:
    """Issue 12: `--model llama70b --gpus-per-node 8 --nodes 2 --gpu-memory 80GiB` no longer picks ZeRO-3 at 93 GiB."""
    code, out, _ = run(
        capsys, "plan", "--model", str(llama70b), "--gpus-per-node", "8", "--nodes", "2", "--gpu-memory", "80GiB"
    )
    assert code == 0
    lines = out.splitlines()
    assert "GPU 80.00 GiB less headroom 10.00 GiB (2.00 GiB + 10% of the GPU) = 70.00 GiB usable" in lines[2]
    assert lines[3].startswith("activations 5.26 GiB = 80 layer inputs 2.50 + one layer recomputed 1.78")
    assert "seq 2048" in out and "micro-batch 1, gradient checkpointing;" in out
    assert (
        "   3      none       none      77.84          5.26      10.00    93.10    46.97       -  no            0"
        in lines
    )
    assert [line for line in lines if line.startswith("*")] == [
        "*  3      cpu        none      12.13          5.26      10.00    27.39   788.50       -  yes          11"
    ]


def test_the_activation_options_reach_the_plan(capsys: pytest.CaptureFixture[str], llama70b: Path) -> None:
    """--seq-len, --micro-batch, --no-gradient-checkpointing, --flash-attention and --headroom show in the JSON."""
    code, out, _ = run(
        capsys,
        "plan",
        "--model",
        str(llama70b),
        "--gpus-per-node",
        "8",
        "--gpu-memory",
        "80GiB",
        "--seq-len",
        "4096",
        "--micro-batch",
        "2",
        "--no-gradient-checkpointing",
        "--flash-attention",
        "--headroom",
        "3GiB+5%",
        "--json",
    )
    assert code == 0
    data = json.loads(out)
    assert (data["seq_len"], data["micro_batch"], data["gradient_checkpointing"], data["flash_attention"]) == (
        4096,
        2,
        False,
        True,
    )
    assert data["headroom"] == {"fixed": 3 * 2**30, "percent": 5.0}
    assert data["headroom_bytes"] == 3 * 2**30 + 4 * 2**30
    assert data["activations"]["layer_inputs"] == 0
    assert data["activations"]["layers"] == 80 * 34 * 4096 * 2 * 8192
    assert data["recommended"] is None  # 170 GiB of activations fit no 80 GiB GPU


def test_sizes_tell_gb_from_gib_and_refuse_a_bare_number(capsys: pytest.CaptureFixture[str]) -> None:
    """24GB is 24e9 bytes (and said), 24GiB is 24·2**30, '24' alone is refused with both spellings offered."""
    code, out, _ = run(capsys, "plan", "--params", "7B", "--gpu-memory", "24GB")
    assert code == 0 and "GPU 22.35 GiB less headroom" in out and "gpu_memory '24GB' is read as" in out
    code, out, _ = run(capsys, "plan", "--params", "7B", "--gpu-memory", "24GiB")
    assert code == 0 and "GPU 24.00 GiB less headroom" in out
    code, _, err = run(capsys, "plan", "--params", "7B", "--gpu-memory", "24")
    assert code == 2
    assert (
        err == "dsbuild: error: gpu_memory: got '24', expected a unit: '24GiB' (2**30 bytes), '24GB' (10**9) or '24B'\n"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gpu-memory", "1e400GiB"], "gpu_memory: got '1e400GiB', expected a size up to 1 EiB"),
        (["--gpu-memory=-80GiB"], "gpu_memory: got '-80GiB', expected a size such as"),
        (["--headroom", "100%"], "headroom: got '100%', expected a percent of the GPU below 100%"),
        (["--headroom", "2"], "headroom: got '2', expected a size with its unit, a percent of the GPU or both"),
    ],
)
def test_bad_sizes_exit_2_with_the_reason(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    """Out-of-range and unit-less sizes and headrooms are usage errors, never a traceback."""
    code, _, err = run(capsys, "plan", "--params", "7B", *argv)
    assert code == 2 and err.startswith(f"dsbuild: error: {message}")


@pytest.mark.parametrize("option", ["--seq-len", "--micro-batch"])
def test_seq_len_and_micro_batch_are_positive(capsys: pytest.CaptureFixture[str], option: str) -> None:
    """0 tokens or sequences is refused by the option itself."""
    code, _, err = run(capsys, "plan", "--params", "7B", option, "0")
    assert code == 2 and f"argument {option}: expected a positive integer, got '0'" in err


def test_the_help_states_the_planners_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    """The defaults --help names are plan()'s own (the CLI passes nothing it was not given)."""
    import inspect

    from dsbuild.planner import DEFAULT_HEADROOM, plan

    defaults = {k: v.default for k, v in inspect.signature(plan).parameters.items()}
    assert (defaults["seq_len"], defaults["micro_batch"], defaults["gradient_checkpointing"]) == (2048, 1, True)
    assert DEFAULT_HEADROOM.describe() == "2.00 GiB + 10% of the GPU"
    code, out, _ = run(capsys, "plan", "--help")
    assert code == 0
    text = " ".join(out.split())
    for default in ("(default: 2048)", "(default: 1)", "(default: on)", "(default: 2GiB+10%)"):
        assert default in text


@pytest.mark.train
def test_plan_reads_a_lora_job(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """--model JOB plans the job's model as LoRA, at its sequence length, micro-batch and processes; flags win."""
    job = tmp_path / "job.toml"
    job.write_text(
        '[model]\ntokenizer = "byte"\n[model.config]\nmodel_type = "llama"\nhidden_size = 4096\n'
        "intermediate_size = 11008\nnum_hidden_layers = 32\nnum_attention_heads = 32\nnum_key_value_heads = 32\n"
        'vocab_size = 32000\n[model.lora]\nr = 8\ntarget_modules = ["q_proj", "v_proj"]\n'
        '[data]\npath = "train.jsonl"\nformat = "text"\nmax_length = 1024\n'
        '[training]\nper_device_train_batch_size = 2\n[strategy]\nconfig = "zero2"\n[launch]\nnproc_per_node = 8\n'
    )
    (tmp_path / "train.jsonl").write_text('{"text": "hi"}\n')
    assert main(["plan", "--model", str(job), "--gpu-memory", "24GiB"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(
        "6.74B parameters (llama config, counted analytically; largest layer 131.07M), 8 GPUs per node"
    )
    assert "seq 1024 x micro-batch 2" in out.replace("\n  ", " ")
    assert "LoRA: 4.19M trainable adapter parameters" in out.replace("\n    ", " ")
    assert main(["plan", "--model", str(job), "--gpu-memory", "24GiB", "--gpus-per-node", "4"]) == 0
    assert "4 GPUs per node" in capsys.readouterr().out


def test_plan_counts_a_dpo_jobs_reference(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """--model on a task = "dpo" job counts its reference (its weights as trained: fp32 here, whole below stage 3), at
    [dpo] max_length tokens and two rows a pair; precompute = true keeps no reference, and --reference adds one."""
    job = tmp_path / "job.toml"
    text = (
        'task = "dpo"\n[model]\ntokenizer = "byte"\n[model.config]\nmodel_type = "llama"\nhidden_size = 4096\n'
        "intermediate_size = 11008\nnum_hidden_layers = 32\nnum_attention_heads = 32\nnum_key_value_heads = 32\n"
        'vocab_size = 32000\n[data]\npath = "pairs.jsonl"\nformat = "preference"\n[dpo]\nmax_length = 512\n'
        '[training]\nper_device_train_batch_size = 2\n[strategy]\nconfig = "zero2"\n[launch]\nnproc_per_node = 8\n'
    )
    job.write_text(text)
    (tmp_path / "pairs.jsonl").write_text('{"prompt": "a", "chosen": " b", "rejected": " c"}\n')

    def planned(*flags: str) -> dict[str, Any]:
        assert main(["plan", "--model", str(job), "--json", *flags]) == 0
        return json.loads(capsys.readouterr().out)

    with_reference = planned()
    assert (with_reference["seq_len"], with_reference["micro_batch"]) == (512, 4)
    assert any(note.startswith("reference model: a second copy") for note in with_reference["notes"])
    job.write_text(text + "[reference]\nprecompute = true\n")
    precomputed = planned()
    assert not any(note.startswith("reference model") for note in precomputed["notes"])
    stage0 = next(r for r in with_reference["rows"] if r["stage"] == 0)
    alone = next(r for r in precomputed["rows"] if r["stage"] == 0)
    assert stage0["gpu_bytes_per_device"] - alone["gpu_bytes_per_device"] == 4 * with_reference["params"]
    assert any(note.startswith("reference model") for note in planned("--reference")["notes"])


def test_plan_counts_a_kto_jobs_reference_unless_precomputed(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A task = "kto" job's plan counts its reference; with [reference] precompute = true it keeps none."""
    job = tmp_path / "job.toml"
    text = (
        'task = "kto"\n[model]\ntokenizer = "byte"\n[model.config]\nmodel_type = "llama"\nhidden_size = 512\n'
        "intermediate_size = 1024\nnum_hidden_layers = 4\nnum_attention_heads = 8\nvocab_size = 32000\n"
        '[data]\npath = "records.jsonl"\nformat = "unpaired"\n[training]\nper_device_train_batch_size = 2\n'
        '[strategy]\nconfig = "zero2"\n'
    )
    job.write_text(text)
    (tmp_path / "records.jsonl").write_text('{"prompt": "a", "completion": " b", "label": true}\n')

    def notes() -> list[str]:
        assert main(["plan", "--model", str(job), "--json"]) == 0
        found: list[str] = json.loads(capsys.readouterr().out)["notes"]
        return found

    assert any(note.startswith("reference model: a second copy") for note in notes())
    job.write_text(text + "[reference]\nprecompute = true\n")
    assert not any(note.startswith("reference model") for note in notes())


def test_plan_counts_a_grpo_jobs_reference_only_with_a_kl_term(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """--model on a task = "grpo" job counts a reference when [grpo] beta > 0 (the KL term's), none at TRL's default
    beta = 0."""
    job = tmp_path / "job.toml"
    text = (
        'task = "grpo"\n[model]\ntokenizer = "byte"\n[model.config]\nmodel_type = "llama"\nhidden_size = 64\n'
        'intermediate_size = 128\nnum_hidden_layers = 2\nnum_attention_heads = 4\nvocab_size = 384\n[data]\npath = "prompts.jsonl"\n'
        'format = "prompt"\n[rewards]\nfunctions = ["r:f"]\n[training]\nper_device_train_batch_size = 8\n'
        '[strategy]\nconfig = "zero2"\n'
    )
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "a"}\n')

    def notes(extra: str) -> list[str]:
        job.write_text(text + extra)
        assert main(["plan", "--model", str(job), "--json"]) == 0
        return list(json.loads(capsys.readouterr().out)["notes"])

    assert not any(n.startswith("reference model") for n in notes(""))
    assert any(n.startswith("reference model") for n in notes("[grpo]\nbeta = 0.04\n"))


def _precision_job(tmp_path: Path, training: str = "", overrides: str = "") -> Path:
    """A ZeRO-3 job on 2 GPUs whose [training] and [strategy.overrides] end with the lines given."""
    job = tmp_path / "job.toml"
    job.write_text(
        '[model]\ntokenizer = "byte"\n[model.config]\nmodel_type = "llama"\nhidden_size = 128\n'
        "intermediate_size = 256\nnum_hidden_layers = 4\nnum_attention_heads = 4\nvocab_size = 384\n"
        '[data]\npath = "train.jsonl"\nformat = "text"\nmax_length = 64\n'
        f"[training]\nper_device_train_batch_size = 4\nmax_steps = 10\n{training}"
        f'[strategy]\nconfig = "zero3"\n[strategy.overrides]\n{overrides}[launch]\nnproc_per_node = 2\n'
    )
    (tmp_path / "train.jsonl").write_text('{"text": "hi"}\n')
    return job


def test_plan_counts_a_jobs_precision_as_its_run_resolves_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Issue 41: an fp32 job and a bf16 job plan different rows, each with DeepSpeed's bytes per parameter for its
    precision, and the plan says which precision, model dtype and optimizer it counted."""

    def planned(job: Path, *flags: str) -> dict[str, Any]:
        assert main(["plan", "--model", str(job), "--json", *flags]) == 0
        return dict(json.loads(capsys.readouterr().out))

    fp32 = planned(_precision_job(tmp_path))
    bf16 = planned(_precision_job(tmp_path, "bf16 = true\n"))
    P, L = fp32["params"], fp32["largest_layer_params"]
    assert (P, L) == (bf16["params"], bf16["largest_layer_params"]) == (754_816, 49_152)
    rows = {p["precision"]["training"]: {(r["stage"], r["offload_optimizer"], r["offload_param"]): r for r in p["rows"]}
            for p in (fp32, bf16)}  # fmt: skip
    assert rows["fp32"][0, "none", "none"]["gpu_bytes_per_device"] == 16 * P == 12_077_056
    assert rows["bf16"][0, "none", "none"]["gpu_bytes_per_device"] == 20 * P == 15_096_320
    assert rows["fp32"][3, "none", "none"]["gpu_bytes_per_device"] == 8 * L + 16 * P // 2 == 6_431_744
    assert rows["bf16"][3, "none", "none"]["gpu_bytes_per_device"] == 4 * L + 18 * P // 2 == 6_989_952
    assert rows["fp32"][2, "none", "none"]["bytes_per_param"] == {"weights": 4, "gradients": 4, "optimizer": 16}
    assert fp32["precision"] == {"training": "fp32", "dtype": None, "optimizer": "AdamW", "states": None,
                                 "optimizer_states": 2, "weight_bytes": 4}  # fmt: skip
    assert bf16["precision"]["training"] == "bf16" and bf16["precision"]["weight_bytes"] == 2
    assert main(["plan", "--model", str(_precision_job(tmp_path))]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[1:3] == [
        "model states: fp32 (model dtype fp32), AdamW; bytes per parameter: weights 4, gradients 4, optimizer",
        "  16 (stages 1-2 and offload; stage 3: 12; stage 0: 8)",
    ]
    assert main(["plan", "--model", str(_precision_job(tmp_path, "bf16 = true\n"))]) == 0
    assert capsys.readouterr().out.splitlines()[1] == (
        "model states: bf16 mixed precision, AdamW; bytes per parameter: weights 2, gradients 2, optimizer 16"
    )


def test_plan_reads_the_precision_from_the_jobs_config_and_the_flags_win(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """fp16 enabled in the job's ds_config (not [training]) is planned as fp16, [model] dtype counts in fp32
    training, and --precision / --optimizer override the job's."""

    def precision(job: Path, *flags: str) -> dict[str, Any]:
        assert main(["plan", "--model", str(job), "--json", *flags]) == 0
        return dict(json.loads(capsys.readouterr().out)["precision"])

    assert precision(_precision_job(tmp_path, overrides="fp16 = {enabled = true}\n"))["training"] == "fp16"
    job = _precision_job(tmp_path)
    job.write_text(job.read_text().replace('tokenizer = "byte"\n', 'tokenizer = "byte"\ndtype = "bf16"\n'))
    assert precision(job)["weight_bytes"] == 2
    flagged = precision(job, "--precision", "bf16", "--optimizer", "Lion")
    assert (flagged["training"], flagged["optimizer"], flagged["optimizer_states"]) == ("bf16", "Lion", 1)
    assert precision(job, "--optimizer", "SGD")["optimizer_states"] == 1


SMALL_LLAMA = (
    '[model]\ntokenizer = "byte"\n[model.config]\nmodel_type = "llama"\nhidden_size = 64\nintermediate_size = 128\n'
    "num_hidden_layers = 2\nnum_attention_heads = 4\nvocab_size = 384\n"
)


def test_plan_counts_a_reward_jobs_model_as_a_scorer(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """--model on a task = "reward" job plans the model TRL trains: a sequence classifier with one label (the score
    head, hidden x 1, for the LM head, vocab x hidden), as many parameters as transformers builds."""
    from transformers import AutoModelForSequenceClassification, LlamaConfig

    job = tmp_path / "job.toml"
    job.write_text(
        'task = "reward"\n' + SMALL_LLAMA + '[data]\npath = "pairs.jsonl"\nformat = "preference"\n'
        '[training]\nper_device_train_batch_size = 2\n[strategy]\nconfig = "zero2"\n'
    )  # fmt: skip
    (tmp_path / "pairs.jsonl").write_text('{"prompt": "a", "chosen": " b", "rejected": " c"}\n')
    assert main(["plan", "--model", str(job), "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         vocab_size=384, num_labels=1)  # fmt: skip
    built = AutoModelForSequenceClassification.from_config(config)
    assert planned["params"] == sum(p.numel() for p in built.parameters()) == 106_880


def test_plan_counts_a_grpo_jobs_reward_models_at_their_stage(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """--model on a GRPO job with [rewards] models adds each reward model's weights, frozen: whole on every GPU beside
    a policy below stage 3 (or at zero_stage = 0), partitioned at stage 3, in CPU memory with offload_models; a hub
    id (not downloaded) is named in a note, not counted."""
    folder = tmp_path / "rm"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 128, "intermediate_size": 256,
                                                    "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 384,
                                                    "num_labels": 1}))  # fmt: skip
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "a"}\n')
    base = (
        'task = "grpo"\n' + SMALL_LLAMA + '[data]\npath = "prompts.jsonl"\nformat = "prompt"\n'
        '[training]\nper_device_train_batch_size = 8\nbf16 = true\n[launch]\nnproc_per_node = 2\n'
    )  # fmt: skip
    job = tmp_path / "job.toml"

    def rows(rewards: str, config: str = "zero2") -> tuple[dict[int, dict[str, Any]], list[str]]:
        job.write_text(base + f'[strategy]\nconfig = "{config}"\n[rewards]\n{rewards}\n')
        assert main(["plan", "--model", str(job), "--json"]) == 0
        planned = json.loads(capsys.readouterr().out)
        return {(r["stage"], r["offload_optimizer"], r["offload_param"]): r for r in planned["rows"]}, planned["notes"]

    from dsbuild.planner.count import count_scorer

    weights = 2 * count_scorer(folder)  # bf16
    alone, _ = rows('functions = ["r:f"]')
    kept, notes = rows('models = ["rm"]')
    assert any(n.startswith("reward models: 1 of") for n in notes)
    grown = {key: kept[key]["gpu_total_bytes"] - row["gpu_total_bytes"] for key, row in alone.items()}
    assert grown[(0, "none", "none")] == grown[(2, "none", "none")] == weights
    assert grown[(3, "none", "none")] == -(-weights // 2)
    whole, _ = rows('models = ["rm"]\nzero_stage = 0')
    assert whole[(3, "none", "none")]["gpu_total_bytes"] - alone[(3, "none", "none")]["gpu_total_bytes"] == weights
    offloaded, _ = rows('models = ["rm"]\noffload_models = true', config="zero3")
    key = (3, "none", "none")
    assert offloaded[key]["gpu_total_bytes"] == alone[key]["gpu_total_bytes"]
    assert offloaded[key]["cpu_bytes_per_node"] - alone[key]["cpu_bytes_per_node"] == 2 * -(-weights // 2)
    _, notes = rows('models = ["org/reward-model"]')
    assert any(n.startswith("reward model org/reward-model not counted") for n in notes)
