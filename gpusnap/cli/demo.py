"""``gpusnap demo``: the bundled demonstration (``gpusnap.demo``)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import click

from gpusnap.cli import cli


@cli.command()
@click.option("--dir", "work", metavar="DIR",
              help="Work directory for the reference run, the snapshotted run and its snapshots (default: a new temporary one); "
                   "s3://BUCKET/PREFIX: the snapshots go to the store, and the restart comes from it with the local copy deleted.")
@click.option("--epochs", type=click.IntRange(2, 50), default=4, show_default=True, help="Epochs of the demo's training run.")
def demo(work, epochs):
    """Show gpusnap at work on a small training run (about a minute on 2 cores).

    A convolutional classifier on synthetic images (shuffled DataLoader with two workers, AdamW,
    a cosine schedule) is trained once without interruption, then again under `gpusnap run`:
    snapshotted mid-epoch, killed -9 with its whole process group, and continued with
    `gpusnap restart`. The demo prints the stall, the snapshot's size and the restart's time,
    and exits 0 only when the restarted run's final weights equal the uninterrupted run's,
    byte for byte. Needs torch.
    """
    from gpusnap import demo as bundled
    from gpusnap.store import location

    store = None
    if work and location.scheme_of(work):  # the run directory on a store; the rest in a temporary directory
        store = location.resolve(work)[1]
        location.probe(store)
        work = None
    work = (Path(location.local_dir(work)) if work else Path(tempfile.mkdtemp(prefix="gpusnap-demo-")).resolve())
    try:
        sys.exit(bundled.run(work, epochs, store))
    except bundled.DemoFailed as exc:
        click.echo(f"demo: FAILED: {exc}", err=True)
        click.echo(f"hint: the work directory {work} keeps both runs' output and the snapshots; `gpusnap ls {work / 'snapshots'}` lists them", err=True)
        sys.exit(1)
