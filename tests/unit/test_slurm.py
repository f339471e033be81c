"""Slurm: host lists read as ``scontrol show hostnames`` reads them, the job a task belongs to read from the
environment it is given, and where ``dsbuild train`` takes each node value from (flags, then Slurm, then the job)."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dsbuild.errors import ConfigError, InvalidValueError
from dsbuild.run import launch
from dsbuild.run.launch import Nodes, nodes
from dsbuild.run.slurm import MAX_HOSTS, Allocation, allocation, parse_hostlist, unplaced

# -- host lists ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("gpu01", ["gpu01"]),
        ("gpu[01-04,07]", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"]),
        ("node1,node[3-5]", ["node1", "node3", "node4", "node5"]),
        ("x[8-10]", ["x8", "x9", "x10"]),  # the low end's digits set the padding
        ("x[08-10]", ["x08", "x09", "x10"]),
        ("x[0008-10]", ["x0008", "x0009", "x0010"]),
        ("x[7,1-2]", ["x7", "x1", "x2"]),  # in the order written, as Slurm keeps it
        ("a[1-2]b[3-4]", ["a1b3", "a1b4", "a2b3", "a2b4"]),
        ("rack[0-1]-gpu[1-2]", ["rack0-gpu1", "rack0-gpu2", "rack1-gpu1", "rack1-gpu2"]),
        ("[1-3]", ["1", "2", "3"]),
        ("127.0.0.[1-2]", ["127.0.0.1", "127.0.0.2"]),
        ("a,b[1-2],c", ["a", "b1", "b2", "c"]),
        ("a b\tc", ["a", "b", "c"]),  # Slurm also splits at blanks
        ("a,,b,", ["a", "b"]),  # and skips empty names
        ("localhost,localhost", ["localhost", "localhost"]),  # a list, not a set
        ("my_node.cluster-1[5]", ["my_node.cluster-15"]),
    ],
)
def test_a_host_list_names_the_hosts_scontrol_show_hostnames_prints(text: str, hosts: list[str]) -> None:
    parsed = parse_hostlist(text)
    assert parsed.hosts() == hosts
    assert (parsed.count, parsed.first) == (len(hosts), hosts[0])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "'' names no host"),
        (" , ", "' , ' names no host"),
        ("gpu[01-04", "'gpu[01-04' is not a Slurm host list: a '[' without its ']'"),
        ("gpu01]", "'gpu01]' is not a Slurm host list: a ']' without its '[' at character 6"),
        ("gpu[[1]]", "'gpu[[1]]' is not a Slurm host list: a '[' inside brackets at character 5"),
        ("gpu[]", "'gpu[]' is not a Slurm host list: [] holds no number"),
        ("gpu[4-1]", "'gpu[4-1]' is not a Slurm host list: [4-1]: the range 4-1 runs backwards"),
        ("gpu[a-c]", "'gpu[a-c]' is not a Slurm host list: [a-c]: 'a-c' is not a number or a range of numbers (like 7 or 01-04)"),
        ("gpu[1,,2]", "'gpu[1,,2]' is not a Slurm host list: [1,,2]: '' is not a number or a range of numbers (like 7 or 01-04)"),
        ("gpu[-1]", "'gpu[-1]' is not a Slurm host list: [-1]: '-1' is not a number or a range of numbers (like 7 or 01-04)"),
        ("gpu[1-2-3]", "'gpu[1-2-3]' is not a Slurm host list: [1-2-3]: '1-2-3' is not a number or a range of numbers (like 7 or 01-04)"),
        ("gpu[1 - 2]", "'gpu[1 - 2]' is not a Slurm host list: [1 - 2]: '1 - 2' is not a number or a range of numbers (like 7 or 01-04)"),
        ("unit[0-31]rack", "'unit[0-31]rack' is not a Slurm host list: 'rack' follows the last ']' of 'unit[0-31]rack': Slurm ends a name with its numbers"),
        ("pre-[1-3]-suf", "'pre-[1-3]-suf' is not a Slurm host list: '-suf' follows the last ']' of 'pre-[1-3]-suf': Slurm ends a name with its numbers"),
        ("-gpu1", "'-gpu1' is not a Slurm host list: '-gpu1' starts with '-'"),
        ("gpu$(id)", "'gpu$(id)' is not a Slurm host list: 'gpu$(id)' is not part of a host name (letters, digits, '.', '_', '-')"),
        ("gpu\n1", "'gpu\\n1' is not a Slurm host list: 'gpu\\n1' is not part of a host name (letters, digits, '.', '_', '-')"),
        ("n[1234567890123456789]", "'n[1234567890123456789]' is not a Slurm host list: [1234567890123456789]: '1234567890123456789' has more than 18 digits"),
    ],
)  # fmt: skip
def test_a_malformed_host_list_says_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(InvalidValueError) as caught:
        parse_hostlist(text)
    assert str(caught.value) == message


def test_a_host_list_is_counted_without_being_written_out() -> None:
    """A list naming 10^36 hosts is counted and gives its first host at once; only `hosts()` would expand it."""
    started = time.perf_counter()
    huge = parse_hostlist("gpu[000000000000000000-999999999999999999]x[0-999999999999999999],login1")
    assert huge.count == 10**36 + 1
    assert huge.first == "gpu000000000000000000x0"
    with pytest.raises(InvalidValueError) as caught:
        huge.hosts()
    assert str(caught.value) == (  # the list cut short in the message: it can be as long as the environment allows
        "'gpu[000000000000000000-999999999999999999]x[0-99999999999999'... (72 characters) names "
        f"{10**36 + 1} hosts, more than the {MAX_HOSTS} written out"
    )
    long = parse_hostlist(",".join(f"n{i}" for i in range(100_000)))  # a fragmented allocation, written long
    assert (long.count, long.first) == (100_000, "n0")
    assert time.perf_counter() - started < 10  # linear in the text: well under a second when the machine is idle
    assert len(parse_hostlist(f"n[1-{MAX_HOSTS}]").hosts()) == MAX_HOSTS


# -- the job a task belongs to ---------------------------------------------------------------------

TASK = {"SLURM_JOB_ID": "4321", "SLURM_NNODES": "2", "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "gpu[07-08]"}
"""The four variables every task of a job of two nodes sees (here on the second node), outside an srun step."""

STEP = {
    **TASK,
    "SLURM_JOB_NODELIST": "gpu[01-04]",
    "SLURM_JOB_NUM_NODES": "4",
    "SLURM_STEP_NODELIST": "gpu[03-04]",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "0",
}
"""A task of `srun --nodes=2 --ntasks-per-node=1` inside a job of four nodes, on the step's second node."""


def test_a_task_knows_its_nodes_its_rank_and_node_0() -> None:
    job = allocation(TASK)
    assert job == Allocation(
        job_id=4321,
        nnodes=2,
        node_rank=1,
        hosts=parse_hostlist("gpu[07-08]"),
        hosts_from="SLURM_JOB_NODELIST",
        master_addr="gpu07",
        master_port=15000 + 4321,  # a port of the job's own: two jobs sharing node 0 do not collide
        master_addr_from="SLURM_JOB_NODELIST",
        master_port_from="SLURM_JOB_ID",
        in_step=False,
    )
    assert allocation({**TASK, "SLURM_JOB_ID": "1234567"}).master_port == 15000 + 4567  # type: ignore[union-attr]


def test_a_task_of_a_step_reads_the_steps_nodes() -> None:
    """A step may run on fewer nodes than its job: node 0 of the step is the first host of the step's list."""
    job = allocation(STEP)
    assert job is not None
    assert (job.nnodes, job.node_rank, job.master_addr, job.hosts_from, job.in_step) == (
        2, 1, "gpu03", "SLURM_STEP_NODELIST", True
    )  # fmt: skip


def test_master_addr_and_master_port_in_the_environment_win() -> None:
    job = allocation({**TASK, "MASTER_ADDR": "gpu07-ib", "MASTER_PORT": "6000", "SLURM_GPUS_ON_NODE": "8"})
    assert job is not None
    assert (job.master_addr, job.master_addr_from, job.master_port, job.master_port_from, job.gpus_on_node) == (
        "gpu07-ib", "MASTER_ADDR", 6000, "MASTER_PORT", 8
    )  # fmt: skip


def test_no_task_no_guess() -> None:
    """Outside Slurm, or in an salloc shell on the login node (no SLURM_NODEID): no allocation, run as before."""
    assert allocation({}) is None
    assert unplaced({}) is None
    shell = {"SLURM_JOB_ID": "77", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "gpu[01-02]"}
    assert allocation(shell) is None
    assert unplaced(shell) == (
        "inside Slurm job 77 of 2 nodes, but in no task of it (SLURM_NODEID is not set, as in an salloc shell): "
        "training on this machine only; `srun dsbuild train ...` trains on every node"
    )
    assert unplaced({"SLURM_JOB_ID": "77"}) is None
    assert unplaced({"SLURM_JOB_ID": "77", "SLURM_NNODES": "1"}) is None
    assert unplaced({"SLURM_JOB_ID": "77", "SLURM_NNODES": "²"}) is None


@pytest.mark.parametrize(
    ("changes", "messages"),
    [
        ({"SLURM_NODEID": "2"}, ["SLURM_NODEID: 2 is not below the 2 nodes of SLURM_NNODES"]),
        ({"SLURM_NNODES": "3"}, ["SLURM_JOB_NODELIST: 'gpu[07-08]' names 2 hosts, but SLURM_NNODES is 3"]),
        ({"SLURM_JOB_NODELIST": "gpu[07-08"},
         ["SLURM_JOB_NODELIST: 'gpu[07-08' is not a Slurm host list: a '[' without its ']'"]),
        ({"SLURM_JOB_NODELIST": None},
         ["SLURM_JOB_NODELIST: not set (Slurm sets it in every task of a job)"]),
        ({"SLURM_NNODES": None}, ["SLURM_NNODES: not set (Slurm sets it in every task of a job)"]),
        ({"SLURM_NNODES": "²"}, ["SLURM_NNODES: got '²', expected an integer >= 1"]),  # a digit to isdigit(), not to int()
        ({"SLURM_JOB_ID": "1" * 19}, [f"SLURM_JOB_ID: got '{'1' * 19}', expected an integer >= 0"]),
        ({"SLURM_NNODES": "two", "SLURM_NODEID": "-1"},
         ["SLURM_NNODES: got 'two', expected an integer >= 1", "SLURM_NODEID: got '-1', expected an integer >= 0"]),
        ({"SLURM_NNODES": "0"}, ["SLURM_NNODES: got '0', expected an integer >= 1"]),
        ({"MASTER_PORT": "70000"}, ["MASTER_PORT: got '70000', expected an integer from 1 to 65535"]),
        ({"MASTER_ADDR": "-h"}, ["MASTER_ADDR: got '-h', expected a host name or address"]),
        ({"SLURM_LOCALID": "3"},
         ["SLURM_LOCALID: task 3 of this node, not its only one (dsbuild train starts each node's processes itself: "
          "run one task per node (srun --ntasks-per-node=1))"]),
    ],
)  # fmt: skip
def test_an_environment_that_contradicts_itself_names_each_variable(
    changes: dict[str, str | None], messages: list[str]
) -> None:
    env = {**TASK, **changes}
    with pytest.raises(InvalidValueError) as caught:
        allocation({k: v for k, v in env.items() if v is not None})
    assert [str(p) for p in caught.value.problems] == messages


def test_a_step_of_several_tasks_per_node_is_refused() -> None:
    """`srun --ntasks-per-node=8 dsbuild train` would start torchrun 8 times per node."""
    assert (
        allocation({**STEP, "SLURM_STEP_NUM_TASKS": "²", "SLURM_LOCALID": "²"}) is not None
    )  # unreadable: not checked
    with pytest.raises(InvalidValueError) as caught:
        allocation({**STEP, "SLURM_STEP_NUM_TASKS": "16"})
    assert str(caught.value) == (
        "SLURM_STEP_NUM_TASKS: 16 tasks on 2 node(s) (dsbuild train starts each node's processes itself: "
        "run one task per node (srun --ntasks-per-node=1))"
    )


# -- where each node value comes from ------------------------------------------------------------


def test_a_slurm_task_fills_the_node_values_and_says_from_where() -> None:
    assert nodes(8, STEP) == Nodes(
        8, 2, 1, "gpu03", 15000 + 4321,
        origin="2 nodes from Slurm (SLURM_STEP_NODELIST gpu[03-04]), node rank 1, master gpu03:19321",
    )  # fmt: skip


def test_flags_win_over_slurm_and_slurm_over_the_job() -> None:
    by_flags = nodes(8, STEP, nnodes=2, node_rank=0, master_addr="10.0.0.1", master_port=29400)
    assert by_flags == Nodes(
        8, 2, 0, "10.0.0.1", 29400, origin="2 nodes from --nnodes, node rank 0, master 10.0.0.1:29400"
    )
    assert nodes(8, {**STEP, "SLURM_JOB_ID": "bad"}, nnodes=2, node_rank=0, master_addr="a") == Nodes(
        8, 2, 0, "a", None, origin="2 nodes from --nnodes, node rank 0, master a:29500"
    )  # the three flags together never read the environment, broken or not
    one_flag = nodes(8, {**STEP, "MASTER_PORT": "6000"}, master_addr="gpu03-ib")
    assert one_flag.origin == (
        "2 nodes from Slurm (SLURM_STEP_NODELIST gpu[03-04]), node rank 1, master gpu03-ib:6000; "
        "master address from --master-addr, port from MASTER_PORT"
    )
    some_flags = nodes(8, STEP, nnodes=2)
    assert some_flags.origin == (
        "2 nodes from --nnodes, node rank 1, master gpu03:19321; node rank from SLURM_NODEID, "
        "master address from the first host of SLURM_STEP_NODELIST, port from SLURM_JOB_ID"
    )
    over_job = nodes(8, STEP, job_nnodes=4)
    assert (over_job.nnodes, over_job.warnings) == (
        2, ("the job's launch.nnodes is 4, but the Slurm job has 2 node(s): using 2",)
    )  # fmt: skip
    assert nodes(1, {}, job_nnodes=1) == Nodes(1)
    assert nodes(1, {"SLURM_JOB_ID": "9", "SLURM_NNODES": "1", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "gpu1"}) == (
        Nodes(1)  # one node from Slurm: run as on any one machine (torchrun --standalone picks a free port)
    )


def test_what_may_not_be_meant_is_a_warning() -> None:
    shell = nodes(1, {"SLURM_JOB_ID": "77", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "gpu[01-02]"})
    assert (shell.nnodes, len(shell.warnings)) == (1, 1)
    assert shell.warnings[0].startswith("inside Slurm job 77 of 2 nodes, but in no task of it")
    gpus = nodes(1, {**STEP, "SLURM_GPUS_ON_NODE": "8"})
    assert gpus.warnings == (
        "Slurm gave this node 8 GPU(s) (SLURM_GPUS_ON_NODE), and the run starts 1 process(es) on it: "
        "pass --nproc-per-node 8 or set launch.nproc_per_node to use them all",
    )
    assert nodes(8, {**STEP, "SLURM_GPUS_ON_NODE": "8"}).warnings == ()
    batch = nodes(8, {**TASK, "SLURM_NODEID": "0"})
    assert batch.warnings == (
        "the Slurm job has 2 nodes, but this runs outside an srun step (SLURM_STEP_NODELIST is not set), as a batch "
        "script does: only this node starts; start it on every node with `srun dsbuild train ...`",
    )


def test_node_values_that_cannot_work_are_usage_errors() -> None:
    with pytest.raises(ConfigError) as caught:
        nodes(1, {}, nnodes=2)
    assert str(caught.value) == (
        "2 nodes: give each node's launch --node-rank R and --master-addr of node 0 (and --master-port), "
        "or start it on every node with srun inside a Slurm job"
    )
    with pytest.raises(ConfigError) as caught:
        nodes(1, {}, job_nnodes=2, node_rank=0)
    assert str(caught.value).startswith("2 nodes: give each node's launch --node-rank R")
    with pytest.raises(ConfigError) as caught:
        nodes(1, {}, nnodes=2, node_rank=2, master_addr="127.0.0.1")
    assert str(caught.value) == "--node-rank 2: expected 0 to 1 for 2 nodes"
    with pytest.raises(ConfigError) as caught:
        nodes(1, {}, node_rank=1)
    assert str(caught.value) == "--node-rank 1: expected 0 to 0 for 1 nodes"
    with pytest.raises(ConfigError) as caught:  # fewer nodes than Slurm's, from this node's rank
        nodes(
            1, {**STEP, "SLURM_STEP_NODELIST": "gpu[03-05]", "SLURM_STEP_NUM_NODES": "3", "SLURM_NODEID": "2"}, nnodes=2
        )
    assert str(caught.value) == "SLURM_NODEID 2: expected 0 to 1 for 2 nodes"
    with pytest.raises(InvalidValueError) as caught:
        nodes(1, {**TASK, "SLURM_NODEID": "5"})
    assert str(caught.value) == "SLURM_NODEID: 5 is not below the 2 nodes of SLURM_NNODES"


def test_requeue_target_is_the_array_task_or_the_job() -> None:
    """--requeue asks scontrol for the array task (ARRAYJOB_TASK) of an array job, else the job; nothing outside."""
    from dsbuild.run.slurm import requeue_target

    assert (
        requeue_target({"SLURM_JOB_ID": "1234", "SLURM_ARRAY_JOB_ID": "1200", "SLURM_ARRAY_TASK_ID": "7"}) == "1200_7"
    )
    assert requeue_target({"SLURM_JOB_ID": "1234"}) == "1234"
    assert requeue_target({}) is None
    assert requeue_target({"SLURM_JOB_ID": "12; rm -rf /"}) is None  # only an id ever reaches scontrol


def test_torchruns_log_lines_name_the_node_and_the_global_rank() -> None:
    """Each node's torchrun prefixes a rank's lines with its node and global rank ([node1 rank2]:), not torchrun's
    [default0]: on every node; a template the user set is kept."""
    from string import Template

    env = launch.torchrun_env(launch.Nodes(2, 2, 1, "10.0.0.1"), {"PATH": "/bin"})
    template = env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"]
    assert Template(template).safe_substitute(rank=3, local_rank=1, role_name="default") == "[node1 rank3]:"
    mine = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[${rank}]:"}
    assert launch.torchrun_env(launch.Nodes(2), mine)["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] == "[${rank}]:"


def test_an_elastic_run_meets_at_a_c10d_rendezvous_and_restarts() -> None:
    """--nnodes 1:2: torchrun's elastic flags (MIN:MAX, c10d rendezvous at the master address, the run's id, its
    restarts) and no node rank; a rank's lines name the global rank only; a fixed run without restarts has none."""
    elastic = Nodes(2, 2, 0, "10.0.0.1", 29400, min_nodes=1, max_restarts=3, run_id="dsbuild-abc")
    command = launch.torchrun_command(Path("job.toml"), elastic, Path("logs"), [])
    text = " ".join(command)
    assert "--nnodes 1:2 --rdzv-backend c10d --rdzv-endpoint 10.0.0.1:29400 --rdzv-id dsbuild-abc" in text
    assert "--max-restarts 3" in text and "--node-rank" not in text and "--master-addr" not in text
    from string import Template

    template = launch.torchrun_env(elastic, {})["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"]
    assert Template(template).safe_substitute(rank=1, local_rank=0, role_name="default") == "[rank1]:"
    fixed = launch.torchrun_command(Path("job.toml"), Nodes(2, 2, 1, "10.0.0.1"), Path("logs"), [])
    assert "--max-restarts" not in fixed and "--node-rank" in fixed
    assert command[1:3] == fixed[1:3] == ["-m", "dsbuild.cli.agent"]  # torchrun's agent, ended with its run


@pytest.mark.procs
def test_the_agents_process_ends_with_its_run_not_with_its_threads() -> None:
    """torchrun's agent (python -m dsbuild.cli.agent) ends once torchrun's main returns, with its code and its output
    flushed, even while a thread it left (a log tailer nothing stopped) still runs: a node whose launcher was killed
    must not stay in the rendezvous, where the other nodes of an elastic run would wait for it."""
    script = (
        "import runpy, sys, threading, time; threading.Thread(target=time.sleep, args=(600,)).start(); "
        "sys.argv = ['agent', '--help']; runpy.run_module('dsbuild.cli.agent', run_name='__main__')"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)  # not 600 s
    assert done.returncode == 0 and "--nproc-per-node" in done.stdout, done.stderr[-3000:]


def test_node_counts_are_n_or_min_max() -> None:
    from dsbuild.cli.args import node_count

    assert node_count("4") == (4, 4) and node_count("1:4") == (1, 4) and node_count("2:2") == (2, 2)
    for text in ("0", "3:2", "1:", ":2", "a:b", "1:2:3"):
        with pytest.raises(argparse.ArgumentTypeError):
            node_count(text)


def test_the_launchers_of_one_elastic_run_share_the_folders_lock(tmp_path: Path) -> None:
    """Every node's launcher of an elastic run takes the output folder's lock: the first takes it, the others of the
    same run (rendezvous id) join, another run (elastic or not) is kept out; the last one out clears it."""
    from dsbuild.errors import OutputDirError
    from dsbuild.outputs.run_folder import LOCK, lock

    with lock(tmp_path, elastic="run-a") as first:
        assert first
        with lock(tmp_path, elastic="run-a") as second:
            assert not second
            for other in (None, "run-b"):
                with pytest.raises(OutputDirError, match="is in use by process"), lock(tmp_path, elastic=other):
                    pass
        assert '"elastic": "run-a"' in (tmp_path / LOCK).read_text()
    assert (tmp_path / LOCK).read_text() == ""
    with lock(tmp_path) as alone:  # a fixed run: the only one
        assert alone
