"""Job files through the CLI: ``train`` refusing bad jobs (exit 2, one line each; 1 for config errors),
``validate`` / ``explain`` / ``export`` on jobs, and ``export --for hf|accelerate``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from dsbuild import Config, load_job
from dsbuild.cli import main
from dsbuild.env.extras import missing
from dsbuild.interop import for_hf
from dsbuild.job import demo_job_path

DEMO = demo_job_path()


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


@pytest.fixture(autouse=True)
def _outside_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    """`dsbuild train` reads a Slurm job's variables: these tests run as outside one, even on a Slurm cluster."""
    for key in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(key)


@pytest.fixture
def job(tiny_job: Callable[..., Path]) -> Path:
    """A small valid job next to a copy of the demo's training data (the suite's ``tiny_job``)."""
    return tiny_job()


def _edit(path: Path, old: str, new: str) -> Path:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    return path


# -- validate ------------------------------------------------------------------------------


@pytest.mark.train
def test_validate_tells_job_files_from_configs(capsys: pytest.CaptureFixture[str], job: Path, tmp_path: Path) -> None:
    """Job files and ds_configs in one call; a job's config problems are under strategy.config."""
    config = tmp_path / "ds.json"
    config.write_text(json.dumps(Config.zero(2).batch(micro=2).to_dict()))
    code, out, err = run(capsys, "validate", str(job), str(config), str(DEMO))
    assert (code, err) == (0, "")
    assert out == f"{job}: ok\n{config}: ok\n{DEMO}: ok\n3 configs checked, 0 errors, 0 warnings\n"

    _edit(
        job,
        'config = "zero2"',
        'config = "zero2"\n[strategy.overrides.optimizer]\ntype = "AdamW"\nparams = {lr = 5e-4}',
    )
    code, out, _ = run(capsys, "validate", str(job))
    assert code == 1
    assert out.splitlines()[:3] == [
        f"{job}: 1 error, 0 warnings",
        " errors:",
        '  strategy.overrides.optimizer.params.lr: 0.0005 disagrees with learning_rate = 0.001 (set the key to "auto" or to 0.001)',
    ]
    code, out, _ = run(capsys, "validate", str(job), "--set", "training.learning_rate=5e-4")
    assert (code, out.splitlines()[0]) == (0, f"{job}: ok")


def test_validate_lists_every_problem_of_a_bad_job(capsys: pytest.CaptureFixture[str], job: Path) -> None:
    """A job a reader rejects is a job with errors (exit 1), like a config with bad values."""
    _edit(job, "max_steps = 10", 'max_steps = 10\nlearning_rate_ = 1\nseed = "x"')
    code, out, err = run(capsys, "validate", str(job))
    assert (code, err) == (1, "")
    assert out.splitlines()[2:4] == [
        "  training.learning_rate_: unknown key (did you mean 'learning_rate'?)",
        "  training.seed: got 'x', expected an integer >= 0",
    ]


def test_validate_deepspeed_asks_deepspeed_about_a_jobs_resolved_config(
    capsys: pytest.CaptureFixture[str], job: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job's config resolved for its run is what DeepSpeed is asked about; one that resolves only in the run is not."""
    if missing("torch", "deepspeed"):
        pytest.skip("needs DeepSpeed")
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")  # what the CLI sets; set here so it does not outlive the test
    code, out, _ = run(capsys, "validate", "--deepspeed", str(job))
    assert (code, out) == (0, f"{job}: ok\n1 config checked, 0 errors, 0 warnings\n")

    _edit(job, 'config = "zero2"', 'config = "hf_zero3"')
    _edit(job, "max_steps = 10", "num_train_epochs = 1")
    _edit(job, 'path = "train.jsonl"', 'path = "someone/a_hub_dataset"')  # its length is known only in the run
    _, out, _ = run(capsys, "validate", "--deepspeed", str(job))
    assert "  deepspeed: not asked: the config resolves only in the run (strategy.config.scheduler.params." in out
    assert "deepspeed: DeepSpeedConfig" not in out


def test_export_check_a_job_value_the_reader_refuses_exits_1(
    capsys: pytest.CaptureFixture[str], job: Path, tmp_path: Path
) -> None:
    """``export --check`` on a job with a bad value: exit 1 and validate's wording, not "unreadable" (exit 2)."""
    out_path = tmp_path / "ds.json"
    code, _, err = run(capsys, "export", str(job), "-o", str(out_path), "--check", "--set", 'training.seed="x"')
    assert code == 1
    assert err.splitlines() == [
        f"dsbuild: error: {job}: training.seed: got 'x', expected an integer >= 0",
        "dsbuild: error: not written: 1 error",
    ]
    assert not out_path.exists()


def test_validate_set_is_for_jobs(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "validate", "zero2", "--set", "zero_optimization.stage=1")
    assert code == 2
    assert "--set applies to job files" in err and "zero2: unreadable" in out


# -- train: refused before anything starts ----------------------------------------------------


@pytest.mark.train
@pytest.mark.parametrize(
    ("sets", "edit", "expected"),
    [
        (["training.learning_rate=fast"], None, ["training.learning_rate: got 'fast', expected a number >= 0"]),
        (["trainig.max_steps=3"], None, ["trainig: unknown key (did you mean 'training'?)"]),
        ([], ('path = "train.jsonl"', 'path = "nope.jsonl"'), ["data.path: no such file: '{dir}/nope.jsonl' (the training records, relative to the job file)"]),
        ([], ('config = "zero2"', 'config = "zero2"\nname = "vllm"'),
         ["strategy.name: got 'vllm', expected 'deepspeed_train' (the only strategy dsbuild runs)"]),
        (["model.lora.r=0", "data.format=csv"], None,
         ["model.lora.r: got 0, expected an integer > 0", "data.format: got 'csv', expected one of 'alpaca', 'messages', 'prompt_completion', 'sharegpt', 'text', 'tokenized', 'preference', 'prompt', 'unpaired'"]),
        (['launch.device_mapping="0-3,2"'], None, ["launch.device_mapping: device 2 listed twice"]),
        (["training.max_steps"], None, None),
    ],
)  # fmt: skip
def test_train_refuses_a_bad_job_with_one_line_per_problem(
    capsys: pytest.CaptureFixture[str],
    job: Path,
    sets: list[str],
    edit: tuple[str, str] | None,
    expected: list[str] | None,
) -> None:
    """Exit 1 (the job fails its checks, as ``dsbuild validate`` says), every problem on its own
    ``dsbuild: error: JOB: ...`` line, nothing on stdout, no traceback; a malformed ``--set`` is a usage error, exit 2."""
    if edit is not None:
        _edit(job, *edit)
    code, out, err = run(capsys, "train", str(job), *(f"--set={s}" for s in sets))
    assert (code, out) == (1 if expected is not None else 2, "")
    if expected is None:  # a malformed --set
        assert (
            err == "dsbuild: error: --set 'training.max_steps': expected KEY=VALUE, e.g. training.learning_rate=2e-5\n"
        )
        return
    assert err.splitlines() == [f"dsbuild: error: {job}: " + e.format(dir=job.parent) for e in expected]


@pytest.mark.train
def test_train_refuses_a_config_that_fails_validation(capsys: pytest.CaptureFixture[str], job: Path) -> None:
    """A job whose config DeepSpeed would reject for this world size: exit 1, before any process starts."""
    _edit(job, 'config = "zero2"', 'config = "zero2"\n[strategy.overrides]\ntrain_batch_size = 6')
    code, out, err = run(capsys, "train", str(job), "--nproc-per-node", "2")
    assert (code, out) == (1, "")
    lines = err.splitlines()
    assert lines[0].startswith(f"dsbuild: error: {job}: strategy.overrides.train_batch_size: ")
    # The batch triangle's 6 / 2 processes = 3 disagrees with the micro batch too.
    assert "strategy.config.train_micro_batch_size_per_gpu: " in lines[1]
    assert lines[-1] == "dsbuild: error: not started: 2 errors"


@pytest.mark.train
def test_train_checks_the_model_config_and_the_data_before_starting(
    capsys: pytest.CaptureFixture[str], job: Path
) -> None:
    """A misspelt model config field and a bad data record are exit 1 too (they fail the checks ``validate`` makes,
    the same ones, named the same way), before any process or model exists: on 2 processes too, said once."""
    _edit(job, "hidden_size = 64", "hidden_sise = 64")
    code, out, err = run(capsys, "train", str(job))
    assert (code, out) == (1, "")
    assert err == (
        f"dsbuild: error: {job}: model.config.hidden_sise: not a LlamaConfig field (did you mean 'hidden_size'?)\n"
        "dsbuild: error: not started: 1 error\n"
    )
    _edit(job, "hidden_sise = 64", "hidden_size = 64")
    (job.parent / "train.jsonl").write_text('{"instruction": "x", "output": "y"}\n{"instruction": "x"}\n')
    code, out, err = run(capsys, "train", str(job))
    assert (code, out) == (1, "")
    data = job.parent / "train.jsonl"
    assert err == (
        f"dsbuild: error: {job}: data.path: {data}: line 2: field 'output': expected a string, it is missing or null\n"
        "dsbuild: error: not started: 1 error\n"
    )
    assert run(capsys, "train", str(job), "--nproc-per-node", "2") == (1, "", err)  # before any rank: said once


@pytest.mark.train
def test_train_usage_errors(capsys: pytest.CaptureFixture[str], job: Path) -> None:
    code, _, err = run(capsys, "train", str(job), "--nnodes", "2")
    assert code == 2 and "give each node's launch --node-rank R and --master-addr" in err
    code, _, err = run(capsys, "train", str(job), "--nnodes", "2", "--node-rank", "2", "--master-addr", "127.0.0.1")
    assert code == 2 and "--node-rank 2: expected 0 to 1 for 2 nodes" in err
    code, _, err = run(capsys, "train", str(job), "--node-rank", "-1")
    assert code == 2 and "expected an integer >= 0, got '-1'" in err
    # An output folder that cannot be made names the key.
    (job.parent / "a_file").write_text("x")
    output_dir = f"training.output_dir='{job.parent / 'a_file'}'"
    code, _, err = run(capsys, "train", str(job), "--set", output_dir)
    assert code == 2 and f"training.output_dir: cannot use '{job.parent / 'a_file'}': it is a file, not a folder" in err
    # A port torchrun would refuse with a traceback is refused here, before anything starts.
    code, _, err = run(capsys, "train", str(job), "--master-port", "99999")
    assert code == 2 and "--master-port: expected a TCP port number up to 65535, got '99999'" in err


@pytest.mark.train
def test_an_elastic_run_needs_a_rendezvous_and_no_node_rank(capsys: pytest.CaptureFixture[str], job: Path) -> None:
    """--nnodes MIN:MAX: the rendezvous host must be given, the node rank must not; nonsense counts are usage errors,
    and Ray's backend (which restarts its own workers) refuses it."""
    code, _, err = run(capsys, "train", str(job), "--nnodes", "1:2")
    assert code == 2 and "--nnodes 1:2: give --master-addr (and --master-port)" in err
    code, _, err = run(capsys, "train", str(job), "--nnodes", "1:2", "--master-addr", "h", "--node-rank", "1")
    assert code == 2 and "--nnodes 1:2: the rendezvous numbers the nodes: leave out --node-rank" in err
    code, _, err = run(
        capsys, "train", str(job), "--nnodes", "1:2", "--master-addr", "h", "--resume-from", "global_step2"
    )
    assert code == 2 and "--resume-from: not with an elastic run" in err
    for text in ("2:1", "0:2", "1:x", "1:2:3"):
        code, _, err = run(capsys, "train", str(job), "--nnodes", text)
        assert code == 2 and "--nnodes" in err and "expected" in err, (text, err)
    code, _, err = run(
        capsys, "train", str(job), "--nnodes", "1:2", "--master-addr", "h", "--set", "training.save_on_each_node=true"
    )
    assert code == 2 and "training.save_on_each_node: a restart resumes on whichever nodes are left" in err


@pytest.mark.train
def test_train_usage_errors_in_a_slurm_job(
    capsys: pytest.CaptureFixture[str], job: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Slurm environment that contradicts itself is exit 2 before anything starts, one line per variable."""
    slurm = {"SLURM_JOB_ID": "7", "SLURM_NNODES": "2", "SLURM_NODEID": "2", "SLURM_JOB_NODELIST": "gpu[01-03]"}
    for key, value in slurm.items():
        monkeypatch.setenv(key, value)
    code, out, err = run(capsys, "train", str(job))
    assert (code, out) == (2, "")
    assert err == (
        "dsbuild: error: SLURM_NODEID: 2 is not below the 2 nodes of SLURM_NNODES\n"
        "dsbuild: error: SLURM_JOB_NODELIST: 'gpu[01-03]' names 3 hosts, but SLURM_NNODES is 2\n"
    )
    monkeypatch.setenv("SLURM_NODEID", "0")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu[01-")
    code, _, err = run(capsys, "train", str(job), "--nnodes", "2", "--node-rank", "0")  # the address is left to Slurm
    assert (code, err) == (
        2, "dsbuild: error: SLURM_JOB_NODELIST: 'gpu[01-' is not a Slurm host list: a '[' without its ']'\n"
    )  # fmt: skip


def _dsbuild(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return subprocess.run(
        [sys.executable, "-m", "dsbuild", *argv], capture_output=True, text=True, cwd=cwd, timeout=120, env=env
    )


def test_checkpoints_lists_only_checkpoint_folders(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Folders that hold no checkpoint file are not checkpoints: a folder of them is "no checkpoints" (exit 2);
    a folder with DeepSpeed's files and no manifest is a damaged checkpoint (exit 1)."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text("{}\n")
    (tmp_path / "logs").mkdir()
    code, _, err = run(capsys, "checkpoints", str(tmp_path))
    assert code == 2 and err == f"dsbuild: error: {tmp_path}: no checkpoints\n"
    (tmp_path / "global_step2").mkdir()
    (tmp_path / "global_step2" / "mp_rank_00_model_states.pt").write_bytes(b"x")
    code, out, _ = run(capsys, "checkpoints", str(tmp_path))
    assert code == 1 and "global_step2" in out and "DAMAGED" in out and "data" not in out.replace(str(tmp_path), "")


@pytest.mark.procs
@pytest.mark.train
def test_device_mapping_holding_code_is_refused_and_never_run(job: Path, tmp_path: Path) -> None:
    """A ROLL-style device_mapping string is parsed, never evaluated: code in it is an error, and it does not run."""
    marker = tmp_path / "pwned"
    payload = f"__import__('os').system('touch {marker}')"
    _edit(job, "[strategy]", f'[launch]\ndevice_mapping = "{payload}"\n\n[strategy]')
    for argv in (["train", str(job)], ["validate", str(job)], ["export", str(job), "-o", str(tmp_path / "x.json")]):
        done = _dsbuild(*argv, cwd=tmp_path)
        assert done.returncode in (1, 2), done
        assert "Traceback" not in done.stdout + done.stderr
        assert "launch.device_mapping: cannot read \"__import__('os').system(" in done.stdout + done.stderr
    done = _dsbuild("train", str(job), "--set", f"launch.device_mapping=list(range(0,2)) + [{payload}]", cwd=tmp_path)
    assert done.returncode == 2 and "--set launch.device_mapping=" in done.stderr and "not a TOML value" in done.stderr
    assert not marker.exists()


@pytest.mark.train
@pytest.mark.parametrize(
    ("command", "allowed"),
    [
        (["explain"], "[]"),
        (["export", "--for", "hf", "-o", "hf.json"], "[]"),
        # [model.config] is checked against its transformers class (torch comes with its models), then remembered:
        # checked again, the table needs only the tokenizer's transformers
        (["validate"], "['torch', 'transformers'] then ['transformers']"),
    ],
)
@pytest.mark.procs
def test_job_commands_import_only_what_they_check_with(job: Path, command: list[str], allowed: str) -> None:
    """explain / export on a job import nothing heavy; validate imports transformers (and torch, which transformers'
    config classes load) to check the model the first time, transformers alone once the table was accepted, never
    DeepSpeed or peft (only train does)."""
    argv = [command[0], str(job), *command[1:]]
    code = (
        "import sys\nfrom dsbuild.cli import main\n"
        f"code = main({argv!r})\n"
        "print('CODE', code, sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'deepspeed', 'transformers', 'peft'}))\n"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(job.parent / "cache")}  # a cache of its own: nothing remembered yet
    for expected in allowed.split(" then "):
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False, cwd=job.parent,
            env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert f"CODE 0 {expected}" in done.stdout


# -- explain / export ------------------------------------------------------------------------


def test_explain_a_job_says_where_each_value_came_from(capsys: pytest.CaptureFixture[str], job: Path) -> None:
    code, out, _ = run(capsys, "explain", str(job), "--set", "training.gradient_accumulation_steps=2")
    assert code == 0
    rows = {line.split()[0]: line for line in out.splitlines()}
    assert rows["train_batch_size"].split()[1] == "8"
    assert rows["optimizer.params.lr"].endswith("training argument learning_rate")
    assert rows["optimizer.type"].endswith("job: the HF Trainer's AdamW (the strategy config has no optimizer)")
    assert not [key for key in rows if key.startswith("scheduler")]  # the HF Trainer's own schedule runs
    assert f"preset zero2 in {job}" in rows["zero_optimization.stage"]
    code, out, _ = run(capsys, "explain", str(job), "--world-size", "4")
    assert {line.split()[0]: line.split()[1] for line in out.splitlines()}["train_batch_size"] == "16"
    code, _, err = run(capsys, "explain", str(job), "--training", str(job))
    assert code == 2 and "a job has its own [training]: change it with --set training.KEY=VALUE" in err


def test_export_a_job_as_is_resolved_and_for_hf(capsys: pytest.CaptureFixture[str], job: Path, tmp_path: Path) -> None:
    """As is: the run's config with "auto"; --resolve: what Session hands DeepSpeed; --for hf: the Trainer's autos."""
    loaded = load_job(job)
    code, out, _ = run(capsys, "export", str(job), "-o", str(tmp_path / "as_is.json"))
    assert (code, out) == (0, f"wrote {tmp_path / 'as_is.json'}\n")
    assert json.loads((tmp_path / "as_is.json").read_text()) == loaded.config.to_dict()

    code, _, _ = run(capsys, "export", str(job), "--resolve", "--world-size", "2", "-o", str(tmp_path / "r.json"))
    resolved = json.loads((tmp_path / "r.json").read_text())
    assert code == 0 and '"auto"' not in json.dumps(resolved)
    assert resolved == loaded.resolve(world_size=2).to_dict() and resolved["train_batch_size"] == 8

    code, _, _ = run(capsys, "export", str(job), "--for", "hf", "-o", str(tmp_path / "hf.json"))
    assert code == 0
    assert json.loads((tmp_path / "hf.json").read_text()) == for_hf(loaded.config).to_dict()
    # ... and the job's training arguments, by HF's names: TrainingArguments takes them as they are.
    transformers = pytest.importorskip("transformers")
    kwargs = json.loads((tmp_path / "hf.training_args.json").read_text())
    hf_args = transformers.TrainingArguments(**{**kwargs, "deepspeed": None})
    assert kwargs["deepspeed"] == str(tmp_path / "hf.json")
    for name in ("learning_rate", "per_device_train_batch_size", "gradient_accumulation_steps", "max_steps",
                 "warmup_steps", "max_grad_norm", "bf16", "seed"):  # fmt: skip
        assert getattr(hf_args, name) == getattr(loaded.training, name), name
    assert "output_dir" not in kwargs  # the HF run never writes into the dsbuild run's folder
    assert hf_args.lr_scheduler_type.value == loaded.training.lr_scheduler_type

    code, _, err = run(capsys, "export", str(job), "--for", "hf", "--resolve", "-o", str(tmp_path / "x.json"))
    assert code == 2 and "use one or the other" in err


def test_export_a_preset_for_the_hf_trainer(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """`dsbuild export zero3 --for hf -o ds_config.json`: what TrainingArguments(deepspeed=...) expects, checked."""
    out_path = tmp_path / "ds_config.json"
    code, _, _ = run(capsys, "export", "zero3", "--for", "hf", "--check", "-o", str(out_path))
    assert code == 0
    written = json.loads(out_path.read_text())
    assert written == for_hf(Config.preset("zero3")).to_dict()
    assert written["zero_optimization"]["stage3_prefetch_bucket_size"] == "auto"
    assert written["train_micro_batch_size_per_gpu"] == "auto" and written["bf16"] == {"enabled": "auto"}


def test_export_for_accelerate_writes_a_config_and_the_ds_config(
    capsys: pytest.CaptureFixture[str], job: Path, tmp_path: Path
) -> None:
    """--for accelerate: OUT is Accelerate's YAML, pointing at a ds_config named after it; one line says both; "auto"
    only where Accelerate fills it, the rest from the job; nothing else written."""
    yaml = pytest.importorskip("yaml")
    out_path = tmp_path / "accelerate.yaml"
    code, out, _ = run(capsys, "export", str(job), "--for", "accelerate", "--set", "launch.nproc_per_node=4",
                       "--set", "training.bf16=true", "--set", "training.adam_beta2=0.95", "-o", str(out_path))  # fmt: skip
    assert code == 0
    ds_path = tmp_path / "accelerate.ds_config.json"
    assert out == f"wrote {out_path}, {ds_path}  (accelerate launch --config_file {out_path} your_script.py)\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [ds_path.name, out_path.name, "job.toml", "train.jsonl"]
    settings = yaml.safe_load(out_path.read_text())
    assert settings["distributed_type"] == "DEEPSPEED" and settings["compute_environment"] == "LOCAL_MACHINE"
    assert settings["deepspeed_config"] == {"deepspeed_config_file": str(ds_path), "zero3_init_flag": False}
    assert (settings["num_processes"], settings["num_machines"]) == (4, 1) and "mixed_precision" not in settings
    written = json.loads(ds_path.read_text())
    assert written["train_batch_size"] == written["optimizer"]["params"]["lr"] == "auto"
    assert written["bf16"] == {"enabled": True} and written["gradient_clipping"] == 1.0
    assert written["optimizer"]["params"]["betas"] == [0.9, 0.95]

    # --ds-config names the file instead; the files named are written over, as -o always is.
    named = tmp_path / "sub" / "mine.json"
    named.parent.mkdir()
    named.write_text("{}")
    code, out, _ = run(
        capsys, "export", str(job), "--for", "accelerate", "--ds-config", str(named), "-o", str(out_path)
    )
    assert code == 0 and out.startswith(f"wrote {out_path}, {named}  (")
    assert json.loads(named.read_text())["train_batch_size"] == "auto"
    assert yaml.safe_load(out_path.read_text())["deepspeed_config"]["deepspeed_config_file"] == str(named)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["zero3", "--for", "accelerate", "-o", "a.json"], "a.json: --for accelerate writes an Accelerate config: name it .yaml or .yml"),
        (["zero3", "--for", "accelerate", "-o", "a.yaml", "--ds-config", "a.toml"], "--ds-config a.toml: Accelerate reads the ds_config as JSON: name it .json"),
        (["zero3", "--for", "accelerate", "-o", "a.yaml", "--ds-config", "a.yaml"], "--ds-config a.yaml: Accelerate reads the ds_config as JSON: name it .json"),
        (["zero3", "-o", "a.json", "--ds-config", "b.json"], "--ds-config names the ds_config that --for accelerate writes beside its YAML: use -o for this export"),
        (["zero3", "--for", "accelerate", "--resolve", "-o", "a.yaml"], '--resolve fills the "auto" values that --for accelerate leaves for Accelerate: use one or the other'),
    ],
)  # fmt: skip
def test_export_for_accelerate_usage_errors(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str], message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "export", *argv)
    assert (code, out, err) == (2, "", f"dsbuild: error: {message}\n")
    assert list(tmp_path.iterdir()) == []


def test_export_for_accelerate_refuses_what_only_the_hf_trainer_fills(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A ds_config without training arguments: each "auto" Accelerate leaves is named with what fills it; nothing
    written. Given the arguments, the same export works."""
    out_path = tmp_path / "a.yaml"
    code, out, err = run(capsys, "export", "hf_zero3", "--for", "accelerate", "-o", str(out_path))
    lines = err.splitlines()
    assert code == 2 and out == "" and list(tmp_path.iterdir()) == []
    assert [line.split(":")[2].strip() for line in lines[:-1]] == [
        "fp16.enabled",
        "bf16.enabled",
        "optimizer.params.betas",
        "optimizer.params.eps",
        "gradient_clipping",
    ]
    assert lines[2] == (
        'dsbuild: error: optimizer.params.betas: "auto" needs the training arguments adam_beta1 and adam_beta2 '
        "(give --training FILE or --set training.NAME=VALUE)"
    )
    assert lines[-1].startswith('dsbuild: error: not written: --for accelerate keeps "auto" only where Accelerate')
    code, _, _ = run(
        capsys, "export", "hf_zero3", "--for", "accelerate", "--set", "training.bf16=true", "-o", str(out_path)
    )
    assert code == 0 and json.loads((tmp_path / "a.ds_config.json").read_text())["bf16"] == {"enabled": True}
