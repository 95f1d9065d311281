"""The ``gpusnap`` command. Importing this package must never import torch: the supervisor
lives here and has to stay responsive while the trainee is inside a CUDA call."""

from __future__ import annotations

import sys

import click

from gpusnap import __version__
from gpusnap.errors import GpusnapError


class _Group(click.Group):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except GpusnapError as exc:
            click.echo(f"gpusnap: {exc.message}", err=True)
            click.echo(f"hint: {exc.hint}", err=True)
            sys.exit(exc.exit_code)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpusnap")
def cli():
    """Snapshot an unmodified training program and continue it after preemption.

    \b
      gpusnap run train.py --epochs 3      run it; SIGUSR1, SIGTERM or --every snapshot it
      gpusnap restart DIR                  continue from the newest snapshot in DIR
      gpusnap ls DIR                       list the snapshots
      gpusnap demo                         watch one run snapshotted, killed and restarted
    """


def _register() -> None:
    from gpusnap.cli import run as _run  # noqa: F401  (commands register themselves)
    from gpusnap.cli import store as _store  # noqa: F401
    from gpusnap.cli import demo as _demo  # noqa: F401


def main() -> None:
    _register()
    cli(prog_name="gpusnap")
