"""The loss plot of a run (``loss.png``; a GRPO run's mean reward beside it): drawn from its history file, in a
short-lived child process.

The training process never imports matplotlib: the figure is drawn by ``python -c`` reading the history
file the run wrote, so the plotting library's memory is never added to the run's peak. ``Plotter`` starts that
child when the run starts, so it imports matplotlib while the run builds its model, and the plot at the end costs
only the drawing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import MissingDependencyError
from .history import read

__all__ = ["Plotter", "plot_file", "plot_in_child", "plot_loss"]


def plot_loss(history: Sequence[dict[str, Any]], path: Path, *, title: str = "") -> Path:
    """Plot the training loss per optimizer step (and the evaluation loss; a GRPO run's mean reward, ``reward``, on a
    second axis) to ``path`` (PNG, no display needed)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise MissingDependencyError("matplotlib", "plotting the loss", extra="train") from None

    train = [(r["step"], r["loss"]) for r in history if r.get("loss") is not None]
    evaluation = [(r["step"], r["eval_loss"]) for r in history if r.get("eval_loss") is not None]
    rewards = [(r["step"], r["reward"]) for r in history if r.get("reward") is not None]
    # A Figure with its own Agg canvas: no pyplot, so no global backend is chosen for the caller.
    figure = Figure(figsize=(7, 4), dpi=100)
    FigureCanvasAgg(figure)
    ax = figure.add_subplot()
    if train:
        ax.plot(*zip(*train, strict=True), linewidth=1, label="training loss")
    if evaluation:
        ax.plot(*zip(*evaluation, strict=True), marker="o", label="evaluation loss")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if rewards:  # GRPO: the loss says little; the mean reward on its own axis, at the steps that generated
        other = ax.twinx()
        other.plot(*zip(*rewards, strict=True), color="tab:green", marker=".", linewidth=1, label="mean reward")
        other.set_ylabel("mean reward")
        more = other.get_legend_handles_labels()
        handles, labels = handles + more[0], labels + more[1]
    ax.legend(handles, labels)
    figure.tight_layout()
    tmp = path.with_name(f".{path.stem}.tmp.png")
    figure.savefig(tmp)
    os.replace(tmp, path)
    return path


def plot_file(history_file: Path, png: Path, title: str = "") -> Path:
    """Plot the history file ``history_file`` to ``png``."""
    return plot_loss(read(history_file), png, title=title)


_CHILD = """
import json, sys
from pathlib import Path
from dsbuild.outputs.plot import plot_file
try:
    import matplotlib.backends.backend_agg, matplotlib.figure  # while the run starts, before it asks
except ImportError:
    pass
text = sys.stdin.read()
if not text:
    sys.exit(0)  # the run ended without asking for a plot
a = json.loads(text)
try:
    plot_file(Path(a["history"]), Path(a["png"]), a["title"])
except Exception as e:  # one line back to the run: the plot is never worth failing it
    sys.exit(f"{type(e).__name__}: {e}" if not str(e).startswith("plotting") else str(e))
"""


def plot_in_child(history: Path, png: Path, *, title: str = "") -> str | None:
    """Draw ``png`` from ``history`` in a child process; ``None`` when written, else why not (one line)."""
    with Plotter() as plotter:
        return plotter.draw(history, png, title=title)


class Plotter:
    """The plotting child, started now (it imports matplotlib meanwhile) and asked once (``draw``); leaving the
    ``with`` block without asking kills it."""

    def __init__(self) -> None:
        self.child: subprocess.Popen[str] | None = None
        self.why_not: str | None = None
        try:
            self.child = subprocess.Popen(
                [sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
        except OSError as e:
            self.why_not = str(e)

    def __enter__(self) -> Plotter:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def draw(self, history: Path, png: Path, *, title: str = "") -> str | None:
        """Draw ``png`` from ``history``; ``None`` when written, else why not (one line)."""
        if self.child is None:
            return self.why_not or "the plotting process was not started"
        request = json.dumps({"history": str(history), "png": str(png), "title": title})
        child, self.child = self.child, None
        try:
            _, err = child.communicate(input=request, timeout=300)
        except (OSError, subprocess.SubprocessError) as e:
            child.kill()
            child.wait()
            return str(e)
        if child.returncode == 0:
            return None
        lines = err.strip().splitlines()
        return lines[-1] if lines else f"the plotting process exited with {child.returncode}"

    def close(self) -> None:
        """End the child at once if it was never asked: a run that stops or fails leaves without waiting for it
        (torchrun ends the ranks still running once one has left)."""
        child, self.child = self.child, None
        if child is None:
            return
        child.kill()
        child.wait()
        for stream in (child.stdin, child.stderr):
            if stream is not None:
                stream.close()
