"""The ``gpusnap`` command. Importing this package must never import torch: the supervisor
lives here and has to stay responsive while the trainee is inside a CUDA call."""

from __future__ import annotations

import os
import sys

import click

from gpusnap import __version__, knobs
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


def _trust_dir(ctx, param, value) -> None:
    if value:  # this process's checks, and the trainee's and its writers' (they inherit the environment)
        knobs.TRUST_DIR = 1
        os.environ["GPUSNAP_TRUST_DIR"] = "1"


trust_dir_option = click.option(
    "--trust-dir", is_flag=True, expose_value=False, is_eager=True, callback=_trust_dir,
    help="Use DIR even if another user owns it or others can write to it (GPUSNAP_TRUST_DIR=1). A snapshot is "
         "code: whoever can write DIR can run code as you when it is restored.")


def _register() -> None:
    from gpusnap.cli import run as _run  # noqa: F401  (commands register themselves)
    from gpusnap.cli import store as _store  # noqa: F401
    from gpusnap.cli import demo as _demo  # noqa: F401


def main() -> None:
    _register()
    cli(prog_name="gpusnap")
