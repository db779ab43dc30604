"""``npsemiseg pretrain``: the mini-study's pretrained backbone (cached by the hash of its configuration)."""

from __future__ import annotations

import typer

from npsemiseg.pretrain import PretrainConfig
from semiseg_platform.cli.app import TRACKING_HELP, app, fail
from semiseg_platform.pretrain_runs import pretrain_command
from semiseg_platform.tracking import DEFAULT_EXPERIMENT


@app.command()
def pretrain(
    backbone: str = typer.Option("resnet_small", help="backbone to pretrain (npsemiseg.models BACKBONES)"),
    steps: int = typer.Option(PretrainConfig.steps, help="training steps"),
    seed: int = typer.Option(PretrainConfig.seed, help="seed of the corpus and the training"),
    corpus_size: int = typer.Option(PretrainConfig.corpus_size, help="images in the pretraining corpus"),
    image_size: int = typer.Option(PretrainConfig.image_size, help="corpus image size (pixels)"),
    batch_size: int = typer.Option(PretrainConfig.batch_size, help="images per step"),
    lr: float = typer.Option(PretrainConfig.lr, help="learning rate"),
    optimizer: str = typer.Option(PretrainConfig.optimizer, help="adamw or sgd"),
    threads: int = typer.Option(PretrainConfig.threads, help="intra-op threads (the weights depend on it: part of "
                                                             "the cache key)"),
    cache_dir: str | None = typer.Option(None, help="cache folder (default: $NPSEMISEG_CACHE/pretrain, "
                                                    "else ~/.cache/npsemiseg/pretrain)"),
    tracking: str | None = typer.Option(None, help=TRACKING_HELP),
    experiment: str = typer.Option(DEFAULT_EXPERIMENT, help="MLflow experiment of the pretraining run"),
    ship: bool = typer.Option(False, help="copy the named configuration's build (--name; without it, the default's) "
                                          "into npsemiseg/weights/ (the file pretrained:<name> loads) and print its "
                                          "SHA-256 to record"),
    name: str | None = typer.Option(None, help="build the named pretraining of npsemiseg.pretrain.PRETRAINED (e.g. "
                                               "vit_mini); the configuration options above are then not used"),
) -> None:
    """Pretrain the backbone on the study's disjoint corpus (a cache hit returns at once); print the
    ``model.weights=PATH`` to give a cell. Logged as an MLflow run of its own."""
    try:
        pretrain_command(backbone=backbone, steps=steps, seed=seed, corpus_size=corpus_size, image_size=image_size,
                         batch_size=batch_size, lr=lr, optimizer=optimizer, threads=threads, cache_dir=cache_dir,
                         tracking=tracking,
                         experiment=experiment,
                         emit=typer.echo, ship=ship, name=name)
    except ValueError as error:
        fail(str(error))
