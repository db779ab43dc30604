"""``npsemiseg pretrain``: the mini-study's pretrained backbone (cached by the hash of its configuration)."""

from __future__ import annotations

import typer

from semiseg_platform.cli.app import TRACKING_HELP, app, fail

#: the help of an option whose default is ``npsemiseg.pretrain.PretrainConfig``'s
_DEFAULT = " (default: PretrainConfig's)"


@app.command()
def pretrain(
    backbone: str = typer.Option("resnet_small", help="backbone to pretrain (npsemiseg.models BACKBONES)"),
    steps: int | None = typer.Option(None, help="training steps" + _DEFAULT),
    seed: int | None = typer.Option(None, help="seed of the corpus and the training" + _DEFAULT),
    corpus_size: int | None = typer.Option(None, help="images in the pretraining corpus" + _DEFAULT),
    image_size: int | None = typer.Option(None, help="corpus image size (pixels)" + _DEFAULT),
    batch_size: int | None = typer.Option(None, help="images per step" + _DEFAULT),
    lr: float | None = typer.Option(None, help="learning rate" + _DEFAULT),
    optimizer: str | None = typer.Option(None, help="adamw or sgd" + _DEFAULT),
    threads: int | None = typer.Option(None, help="intra-op threads (the weights depend on it: part of the cache "
                                                  "key)" + _DEFAULT),
    cache_dir: str | None = typer.Option(None, help="cache folder (default: $NPSEMISEG_CACHE/pretrain, "
                                                    "else ~/.cache/npsemiseg/pretrain)"),
    tracking: str | None = typer.Option(None, help=TRACKING_HELP),
    experiment: str = typer.Option("npsemiseg", help="MLflow experiment of the pretraining run"),
    ship: bool = typer.Option(False, help="copy the named configuration's build (--name; without it, the default's) "
                                          "into npsemiseg/weights/ (the file pretrained:<name> loads) and print its "
                                          "SHA-256 to record"),
    name: str | None = typer.Option(None, help="build the named pretraining of npsemiseg.pretrain.PRETRAINED (e.g. "
                                               "vit_mini); the configuration options above are then not used"),
) -> None:
    """Pretrain the backbone on the study's disjoint corpus (a cache hit returns at once); print the
    ``model.weights=PATH`` to give a cell. Logged as an MLflow run of its own."""
    from semiseg_platform.pretrain_runs import pretrain_command

    given = dict(steps=steps, seed=seed, corpus_size=corpus_size, image_size=image_size, batch_size=batch_size, lr=lr,
                 optimizer=optimizer, threads=threads)
    try:
        pretrain_command(backbone=backbone, cache_dir=cache_dir, tracking=tracking, experiment=experiment,
                         emit=typer.echo, ship=ship, name=name, **{k: v for k, v in given.items() if v is not None})
    except ValueError as error:
        fail(str(error))
