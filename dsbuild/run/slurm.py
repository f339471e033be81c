"""The Slurm job a command runs in: how many nodes, which one this is, and node 0's address.

Everything here reads an environment it is given (the CLI passes ``os.environ``) and nothing calls
``scontrol``, which a compute node may lack (``dsbuild train --requeue`` calls ``scontrol requeue`` with
``requeue_target``'s id, where the user asked for it): ``parse_hostlist`` reads Slurm's host-list syntax itself and
gives the hosts ``scontrol show hostnames`` prints. It counts a list's hosts without writing them out, so
a list naming millions of hosts costs no memory: a run needs only the count and the first host.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping

import attrs

from ..errors import InvalidValueError, Problem

__all__ = ["MAX_HOSTS", "Allocation", "HostList", "allocation", "parse_hostlist", "requeue_target", "unplaced"]

MAX_HOSTS = 65536
"""The most hosts ``HostList.hosts`` writes out (Slurm's own limit for one range)."""

_MAX_DIGITS = 18
"""Slurm reads each number of a range as an unsigned 64-bit integer; 18 digits always fit one."""

_NAME_TEXT = re.compile(r"[A-Za-z0-9._-]*")
"""What a host name holds around its bracket groups."""

_ADDRESS = re.compile(r"[A-Za-z0-9._:][A-Za-z0-9._:-]*")
"""A host name, an IPv4 or an IPv6 address (``MASTER_ADDR``)."""

_ITEM = re.compile(r"([0-9]+)(?:-([0-9]+))?")
"""One entry of a bracket group: ``7`` or ``01-04``."""

_EVERY_TASK = "Slurm sets it in every task of a job"

_PORT_BASE = 15000
"""A job's own port is ``_PORT_BASE`` + the last four digits of its id: below Linux's ephemeral ports
(32768 and up), so no outgoing connection holds it (PyTorch Lightning picks Slurm ports the same way)."""

Group = tuple[tuple[int, int, int], ...]
"""A bracket group: its ranges as (low, high, digits), the digits of the low number setting the zero padding."""


@attrs.frozen
class HostList:
    """A Slurm host list (``gpu[01-04,07]``, ``login1,gpu[3-5]``, ``rack[0-1]-gpu[1-8]``), read but not expanded."""

    text: str
    """The list as written."""
    names: tuple[tuple[str | Group, ...], ...] = attrs.field(repr=False)
    """Each name of the list: its text and its bracket groups, in order."""

    @property
    def count(self) -> int:
        """How many hosts the list names, counted without writing them out."""
        return sum(math.prod(_size(part) for part in name if not isinstance(part, str)) for name in self.names)

    @property
    def first(self) -> str:
        """The first host, where Slurm runs a job's batch script: ``scontrol show hostnames LIST | head -n 1``."""
        return "".join(part if isinstance(part, str) else _number(part[0][0], part[0][2]) for part in self.names[0])

    def hosts(self, limit: int = MAX_HOSTS) -> list[str]:
        """Every host, in the list's order (``a[1-2]b[3-4]``: a1b3, a1b4, a2b3, a2b4, as ``scontrol show hostnames``
        prints it); a list of more than ``limit`` hosts is an error."""
        if self.count > limit:
            raise InvalidValueError(f"{_shown(self.text)} names {self.count} hosts, more than the {limit} written out")
        found: list[str] = []
        for name in self.names:  # each group is at most `limit` long here, so product() holds little
            choices = [(part,) if isinstance(part, str) else _numbers(part) for part in name]
            found.extend("".join(parts) for parts in itertools.product(*choices))
        return found


def parse_hostlist(text: str) -> HostList:
    """Read a Slurm host list as Slurm does; a malformed one is an ``InvalidValueError`` saying what is wrong.

    Names are separated by commas (or spaces). A name may hold bracket groups of numbers and ranges,
    ``gpu[01-04,07]``; the digits of a range's low end set the zero padding (``[08-10]`` is 08, 09, 10).
    Several groups give every combination, ``rack[1-2]-gpu[1-4]``; as in Slurm, the name must end with
    its last group (``unit[0-31]rack`` is refused), and a group holds numbers only.
    """
    names = []
    for name in _split(text):
        if name.startswith("-"):
            raise _bad(text, f"{_shown(name)} starts with '-'")
        parts: list[str | Group] = []
        at = 0
        for start, end in _brackets(name):
            parts.append(_name_text(text, name[at:start]))
            parts.append(_group(text, name[start + 1 : end]))
            at = end + 1
        if at and at < len(name):
            raise _bad(
                text, f"{_shown(name[at:])} follows the last ']' of {_shown(name)}: Slurm ends a name with its numbers"
            )
        parts.append(_name_text(text, name[at:]))
        names.append(tuple(p for p in parts if p != ""))
    if not names:
        raise InvalidValueError(f"{_shown(text)} names no host")
    return HostList(text, tuple(names))


@attrs.frozen
class Allocation:
    """This task's part of a Slurm job: the job's nodes, which one this is, and where node 0 listens."""

    job_id: int
    """``SLURM_JOB_ID``."""
    nnodes: int
    """Nodes of the step (``SLURM_STEP_NUM_NODES``), or of the job outside one (``SLURM_NNODES``)."""
    node_rank: int
    """This node's place among them (``SLURM_NODEID``)."""
    hosts: HostList
    """The nodes (``SLURM_STEP_NODELIST``, or ``SLURM_JOB_NODELIST`` outside a step)."""
    hosts_from: str
    """The variable ``hosts`` was read from."""
    master_addr: str
    """Node 0's address: ``MASTER_ADDR`` where set, else the first host."""
    master_port: int
    """A free port on node 0: ``MASTER_PORT`` where set, else one of this job's own (from its id)."""
    master_addr_from: str
    """Where ``master_addr`` came from: ``MASTER_ADDR`` or the node-list variable."""
    master_port_from: str
    """Where ``master_port`` came from: ``MASTER_PORT`` or ``SLURM_JOB_ID``."""
    in_step: bool
    """Whether this runs in a task of an ``srun`` step (``SLURM_STEP_NODELIST`` set), not in the batch script."""
    gpus_on_node: int | None = None
    """``SLURM_GPUS_ON_NODE``: the GPUs Slurm gave this node, where it says."""


def allocation(env: Mapping[str, str]) -> Allocation | None:
    """This task's part of the Slurm job ``env`` shows; ``None`` when it is no task of one.

    A task has ``SLURM_JOB_ID`` and ``SLURM_NODEID``. A shell of ``salloc`` on the login node has no node
    id: it is no task of the job and gets ``None``, not a guess (``unplaced`` says so). Inside an ``srun``
    step its own variables are read, as a step may use fewer nodes than its job. Variables that cannot
    be read or that contradict each other are one ``InvalidValueError``, naming each variable.
    """
    if "SLURM_JOB_ID" not in env or "SLURM_NODEID" not in env:
        return None
    problems: list[Problem] = []
    in_step = "SLURM_STEP_NODELIST" in env
    if in_step:
        count_from = _first_set(env, ("SLURM_STEP_NUM_NODES", "SLURM_NNODES"))
        hosts_from = "SLURM_STEP_NODELIST"
    else:
        count_from = _first_set(env, ("SLURM_NNODES", "SLURM_JOB_NUM_NODES"))
        hosts_from = _first_set(env, ("SLURM_JOB_NODELIST", "SLURM_NODELIST"))
    job_id = _integer(env, "SLURM_JOB_ID", 0, problems)
    nnodes = _integer(env, count_from, 1, problems)
    node_rank = _integer(env, "SLURM_NODEID", 0, problems)
    hosts = None
    if hosts_from not in env:
        problems.append(Problem(hosts_from, "not set", _EVERY_TASK))
    else:
        try:
            hosts = parse_hostlist(env[hosts_from])
        except InvalidValueError as e:
            problems.extend(Problem(hosts_from, p.message) for p in e.problems)
    if nnodes is not None and node_rank is not None and node_rank >= nnodes:
        problems.append(Problem("SLURM_NODEID", f"{node_rank} is not below the {nnodes} nodes of {count_from}"))
    if nnodes is not None and hosts is not None and hosts.count != nnodes:
        problems.append(
            Problem(hosts_from, f"{_shown(hosts.text)} names {hosts.count} hosts, but {count_from} is {nnodes}")
        )
    _one_task_per_node(env, in_step, nnodes, problems)
    master_addr_from = "MASTER_ADDR" if env.get("MASTER_ADDR") else hosts_from
    master_port_from = "MASTER_PORT" if env.get("MASTER_PORT") else "SLURM_JOB_ID"
    port = _integer(env, "MASTER_PORT", 1, problems, most=65535) if master_port_from == "MASTER_PORT" else None
    if master_addr_from == "MASTER_ADDR" and not _ADDRESS.fullmatch(env["MASTER_ADDR"]):
        problems.append(Problem("MASTER_ADDR", f"got {_shown(env['MASTER_ADDR'])}, expected a host name or address"))
    gpus = _integer(env, "SLURM_GPUS_ON_NODE", 0, problems) if "SLURM_GPUS_ON_NODE" in env else None
    if problems:
        raise InvalidValueError(problems)
    assert job_id is not None and nnodes is not None and node_rank is not None and hosts is not None
    return Allocation(
        job_id=job_id,
        nnodes=nnodes,
        node_rank=node_rank,
        hosts=hosts,
        hosts_from=hosts_from,
        master_addr=env["MASTER_ADDR"] if master_addr_from == "MASTER_ADDR" else hosts.first,
        master_port=port if port is not None else _PORT_BASE + job_id % 10000,
        master_addr_from=master_addr_from,
        master_port_from=master_port_from,
        gpus_on_node=gpus,
        in_step=in_step,
    )


def unplaced(env: Mapping[str, str]) -> str | None:
    """What to say when a command runs inside a Slurm job of several nodes but in no task of it (an ``salloc``
    shell on the login node): it runs on this machine only; ``None`` otherwise."""
    if "SLURM_JOB_ID" not in env or "SLURM_NODEID" in env:
        return None
    count_from = _first_set(env, ("SLURM_NNODES", "SLURM_JOB_NUM_NODES"))
    nnodes = _decimal(env.get(count_from, ""))
    if nnodes is None or nnodes < 2:
        return None
    job = env["SLURM_JOB_ID"] if _decimal(env["SLURM_JOB_ID"]) is not None else _shown(env["SLURM_JOB_ID"])
    return (
        f"inside Slurm job {job} of {nnodes} nodes, but in no task of it (SLURM_NODEID is "
        "not set, as in an salloc shell): training on this machine only; `srun dsbuild train ...` trains on every node"
    )


def _one_task_per_node(env: Mapping[str, str], in_step: bool, nnodes: int | None, problems: list[Problem]) -> None:
    """``dsbuild train`` starts its node's processes itself (torchrun): a second task on a node would start them twice."""
    hint = "dsbuild train starts each node's processes itself: run one task per node (srun --ntasks-per-node=1)"
    tasks_from = _first_set(env, ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")) if in_step else ""
    tasks = _decimal(env.get(tasks_from, ""))
    local_id = _decimal(env.get("SLURM_LOCALID", "0"))
    if nnodes is not None and tasks is not None and tasks > nnodes:
        problems.append(Problem(tasks_from, f"{tasks} tasks on {nnodes} node(s)", hint))
    elif local_id:
        problems.append(Problem("SLURM_LOCALID", f"task {local_id} of this node, not its only one", hint))


def _first_set(env: Mapping[str, str], names: tuple[str, ...]) -> str:
    """The first of ``names`` that ``env`` sets, else the first of them (to name in a message)."""
    return next((name for name in names if name in env), names[0])


def _integer(
    env: Mapping[str, str], name: str, least: int, problems: list[Problem], most: int | None = None
) -> int | None:
    """``env[name]`` as an integer from ``least`` to ``most``; a problem for ``problems`` and ``None`` otherwise."""
    text = env.get(name)
    if text is None:
        problems.append(Problem(name, "not set", _EVERY_TASK))
        return None
    value = _decimal(text)
    if value is None or value < least or (most is not None and value > most):
        expected = f"an integer from {least} to {most}" if most is not None else f"an integer >= {least}"
        problems.append(Problem(name, f"got {_shown(text)}, expected {expected}"))
        return None
    return value


def _decimal(text: str) -> int | None:
    """``text`` as a number, when it is one in ASCII digits (``str.isdigit`` also takes '²', which ``int`` refuses)."""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= _MAX_DIGITS else None


def _split(text: str) -> list[str]:
    """The names of a host list: split at commas and blanks outside brackets; empty names skipped, as Slurm does."""
    names = []
    start = 0
    inside = False
    for at, c in enumerate(text):
        if c == "[":
            if inside:
                raise _bad(text, f"a '[' inside brackets at character {at + 1}")
            inside = True
        elif c == "]":
            if not inside:
                raise _bad(text, f"a ']' without its '[' at character {at + 1}")
            inside = False
        elif c in ", \t" and not inside:
            names.append(text[start:at])
            start = at + 1
    if inside:
        raise _bad(text, "a '[' without its ']'")
    names.append(text[start:])
    return [name for name in names if name]


def _brackets(name: str) -> list[tuple[int, int]]:
    """Where each bracket group of a name starts and ends (``_split`` checked that they pair up)."""
    opens = [at for at, c in enumerate(name) if c == "["]
    return [(start, name.index("]", start)) for start in opens]


def _name_text(text: str, part: str) -> str:
    if not _NAME_TEXT.fullmatch(part):
        raise _bad(text, f"{_shown(part)} is not part of a host name (letters, digits, '.', '_', '-')")
    return part


def _group(text: str, body: str) -> Group:
    """A bracket group's numbers and ranges: ``01-04,07`` is ((1, 4, 2), (7, 7, 2))."""
    if not body:
        raise _bad(text, "[] holds no number")
    group = f"[{body}]" if len(body) <= 60 else f"[{body[:60]}...]"
    ranges = []
    for item in body.split(","):
        match = _ITEM.fullmatch(item)
        if match is None:
            raise _bad(text, f"{group}: {_shown(item)} is not a number or a range of numbers (like 7 or 01-04)")
        low, high = match.group(1), match.group(2) or match.group(1)
        if max(len(low), len(high)) > _MAX_DIGITS:
            raise _bad(text, f"{group}: {_shown(item)} has more than {_MAX_DIGITS} digits")
        if int(low) > int(high):
            raise _bad(text, f"{group}: the range {item} runs backwards")
        ranges.append((int(low), int(high), len(low)))
    return tuple(ranges)


def _size(group: Group) -> int:
    return sum(high - low + 1 for low, high, _ in group)


def _number(value: int, digits: int) -> str:
    return f"{value:0{digits}d}"


def _numbers(group: Group) -> list[str]:
    return [_number(value, digits) for low, high, digits in group for value in range(low, high + 1)]


def _shown(text: str, most: int = 60) -> str:
    """``text`` quoted for a message, cut short: a list can be as long as the environment allows."""
    return repr(text) if len(text) <= most else repr(text[:most]) + f"... ({len(text)} characters)"


def _bad(text: str, why: str) -> InvalidValueError:
    return InvalidValueError(f"{_shown(text)} is not a Slurm host list: {why}")


def requeue_target(env: Mapping[str, str]) -> str | None:
    """The id ``scontrol requeue`` takes for the job this runs in: ``ARRAYJOB_TASK`` for a task of a job array
    (requeueing the array's own ``SLURM_JOB_ID`` works too, but the pair is what ``squeue`` shows), else
    ``SLURM_JOB_ID``; ``None`` outside a Slurm job."""
    array, task = env.get("SLURM_ARRAY_JOB_ID", "").strip(), env.get("SLURM_ARRAY_TASK_ID", "").strip()
    if array.isdigit() and task.isdigit():
        return f"{array}_{task}"
    job = env.get("SLURM_JOB_ID", "").strip()
    return job if job.isdigit() else None
