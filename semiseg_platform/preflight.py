"""Checks before launch: what the driver can check before Ray, MLflow or the storage are touched.

``npsemiseg run``, ``grid`` and ``search`` call :func:`preflight` once their cells are known. Each
check raises :class:`PreflightError` (a ``ValueError``: the CLI prints it as one ``error:`` line
and exits 2) naming the thing and what was expected, so a bad input never leaves an MLflow run,
a checkpoint folder or ``ray_results/`` behind. In order:

- data: every dataset the cells read, with the partitions they read, through
  ``npsemiseg.data.check_dataset``, the check ``npsemiseg data check`` runs: root, layout, every list entry
  inside the dataset's folder, the list files' images and labels (how many are missing, with two examples),
  every image and label decoded as the readers decode them (a truncated image, a label value outside the
  classes), so that a run never fails part-way on its data (an entry found good by an earlier check whose
  files are unchanged is not decoded again: ``check_dataset(reuse=True)``); an S3 root
  (``s3://bucket/prefix/VOC2012``, staged on each node when its cells start): its ``manifest.json`` against the
  lists, the store's listing against the manifest (sizes), nothing downloaded;
- weights: a ``model.weights`` file must exist, a ``pretrained:<name>`` must be a known pretraining (a DINOv2
  backbone: a checkpoint file, ``timm`` or null, and crops / evaluation sizes at multiples of its patch size);
- resources: the GPUs and CPUs one cell asks for against what the machine has (embedded default:
  an error at once); on a cluster (``RAY_ADDRESS``) :func:`wait_for_resources` prints
  ``waiting for resources: ...`` every 30 s and fails after ``--resource-timeout`` seconds;
- tracking: the MLflow store answers one quick probe (a short timeout, not MLflow's retries);
- one host: on a Ray cluster whose nodes are on more than one host, neither the tracking store nor
  the checkpoint storage may be a path on this machine (a SQLite file, a ``file:`` store, a local
  directory) unless declared shared (``--shared-filesystem``, or ``NPSEMISEG_SHARED_FILESYSTEM=1``):
  an NFS mount every node sees at the same path;
- storage: the checkpoint storage is reachable and writable (last: it creates the directory).
"""

from __future__ import annotations

import logging
import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import ray
import torch

from npsemiseg.config import RunConfig
from npsemiseg.data import DATA_ROOT_ENV, dataset_info
from npsemiseg.data.check import check_dataset
from npsemiseg.pretrain import PRETRAINED, PRETRAINED_PREFIX
from npsemiseg.models.vit import is_vit_backbone, vit_settings_problem
from npsemiseg.data.check import data_problem
from semiseg_platform.data_staging import check_remote, is_remote
from semiseg_platform.launch import ensure_ray, in_existing_cluster
from semiseg_platform.logs import PROGRESS
from semiseg_platform.reservations import RESOURCE_TIMEOUT_S, Needed
from semiseg_platform.storage import Storage, parse_storage
from semiseg_platform.tracking.store import resolve_tracking_uri, sqlite_path

#: Seconds between two ``waiting for resources`` lines
WAIT_LINE_EVERY_S = 30.0
#: Seconds the tracking probe waits for an answer
TRACKING_PROBE_TIMEOUT_S = 3.0
#: Set to 1 (or true / yes) to declare the local tracking store and storage paths shared by every node
SHARED_FILESYSTEM_ENV = "NPSEMISEG_SHARED_FILESYSTEM"
#: Default ports of the database schemes MLflow accepts as tracking URIs
_DB_PORTS = {"postgresql": 5432, "postgres": 5432, "mysql": 3306, "mssql": 1433}


class PreflightError(ValueError):
    """A check before launch failed; the message names the thing and what was expected."""


def _progress(line: str) -> None:
    logging.getLogger(PROGRESS).info("%s", line)


# ----------------------------------------------------------------------------- data and weights
def check_data(configs: Iterable[RunConfig]) -> None:
    """Every dataset the cells read, under its root, with the partitions they read (every file decoded). An S3
    root (staged on each node when its cells start): its manifest against the lists, the store's listing against
    the manifest."""
    wanted: dict[tuple[str, str | None, str, bool], set[str]] = {}
    for config in configs:
        reveal = config.data.unlabeled_truth != "hidden"  # the pseudo-label diagnostics read the unlabeled labels
        wanted.setdefault((config.dataset, config.data.root, config.partition_lists, reveal), set()).add(config.partition)
    for (dataset, root, partition_lists, reveal), partitions in wanted.items():
        remote = root if root is not None else os.environ.get(DATA_ROOT_ENV)
        if is_remote(remote) and not dataset_info(dataset).synthetic:
            found = check_remote(remote, dataset, partitions=sorted(partitions), partition_lists=partition_lists)
            if not found.usable:
                raise PreflightError(found.first_problem())
            continue
        report = check_dataset(dataset, root, partitions=sorted(partitions), partition_lists=partition_lists,
                               reuse=True, unlabeled_labels=reveal)
        if not report.usable:
            raise PreflightError(data_problem(report))


def check_weights(configs: Iterable[RunConfig]) -> None:
    """A ``model.weights`` path (not ``imagenet`` / None) must be an existing file; a ``pretrained:<name>``
    must name a pretraining of ``npsemiseg.pretrain.PRETRAINED`` (its file is built on first use) of the cell's
    backbone; a ViT's crop and evaluation sizes must fit its patch size."""
    for config in configs:
        weights = config.model.weights
        named = isinstance(weights, str) and weights.startswith(PRETRAINED_PREFIX)
        if is_vit_backbone(config.model.backbone):
            evaluation, info = config.evaluation, config.dataset_info
            problem = vit_settings_problem(config.model.backbone, None if named else weights, config.schedule.crop_size,
                                           eval_mode=evaluation.mode or info.eval_mode,
                                           eval_crop_size=evaluation.crop_size or info.eval_crop_size,
                                           resize_multiple=evaluation.resize_multiple)
            if problem:
                raise PreflightError(problem)
            if not named:
                continue
        if weights is None or weights == "imagenet":
            continue
        if named:
            _check_pretraining_name(weights, config.model.backbone)
            continue
        if not Path(weights).expanduser().is_file():
            raise PreflightError(f"model.weights: file {weights} does not exist (expected a ResNet state dict .pth, "
                                 "'imagenet' or null for random init)")


def _check_pretraining_name(weights: str, backbone: str) -> None:
    """``pretrained:<name>`` names a pretraining of ``PRETRAINED``, and one of ``backbone``."""
    name = weights[len(PRETRAINED_PREFIX):]
    if name not in PRETRAINED:
        raise PreflightError(f"model.weights: unknown pretraining {weights!r}, expected one of "
                             f"{[PRETRAINED_PREFIX + name for name in PRETRAINED]}")
    if PRETRAINED[name].backbone != backbone:
        fitting = [PRETRAINED_PREFIX + n for n, c in PRETRAINED.items() if c.backbone == backbone]
        raise PreflightError(f"model.weights: {weights} pretrains the {PRETRAINED[name].backbone} backbone, the cell's "
                             f"model.backbone is {backbone} (expected one of {fitting} or another backbone)")


# ----------------------------------------------------------------------------- resources
def machine_resources(ray_init: Mapping[str, Any] | None = None) -> dict[str, float]:
    """What the embedded default will have: the running Ray's resources, else ``ray_init``'s or this machine's."""
    if ray.is_initialized():
        return dict(ray.cluster_resources())
    init = dict(ray_init or {})
    cpus = init.get("num_cpus") if init.get("num_cpus") is not None else os.cpu_count() or 1
    gpus = init.get("num_gpus") if init.get("num_gpus") is not None else torch.cuda.device_count()
    return {"CPU": float(cpus), "GPU": float(gpus)}


def check_resources(needed: Needed, *, resource_timeout: float = RESOURCE_TIMEOUT_S,
                    ray_init: Mapping[str, Any] | None = None, emit: Callable[[str], None] = _progress) -> None:
    """Embedded default: ``PreflightError`` at once when one cell does not fit the machine. Cluster
    (``RAY_ADDRESS``): join it and :func:`wait_for_resources`."""
    if in_existing_cluster():
        ensure_ray()
        wait_for_resources(needed, timeout_s=resource_timeout, emit=emit)
        return
    short = needed.missing(machine_resources(ray_init))
    if short:
        raise PreflightError(f"resources: one cell asks for {needed.describe()}, this machine (the embedded default) "
                             f"lacks {', '.join(short)}; ask for less (e.g. --gpus-per-worker 0) or run on a "
                             "cluster (RAY_ADDRESS)")


def wait_for_resources(needed: Needed, *, timeout_s: float, emit: Callable[[str], None] = _progress,
                       every_s: float = WAIT_LINE_EVERY_S, poll_s: float = 1.0) -> None:
    """Wait until the connected Ray cluster's resources hold one cell, printing ``waiting for resources: ...``
    every ``every_s``; ``PreflightError`` after ``timeout_s``. While it waits it asks the cluster's autoscaler
    (if any) for one cell's bundles (``ray.autoscaler.sdk.request_resources``): nothing else is pending yet,
    so without the request an autoscaler scaled to zero would add no node. The request is withdrawn on return."""
    started = time.monotonic()
    last_line = None
    requested = False
    try:
        while True:
            short = needed.missing(ray.cluster_resources())
            if not short:
                return
            if not requested:
                requested = _request_bundles(needed.bundles())
            waited = time.monotonic() - started
            if waited >= timeout_s:
                raise PreflightError(f"resources: the cluster still lacks {', '.join(short)} for {needed.describe()} "
                                     f"after {timeout_s:g} s (--resource-timeout)")
            if last_line is None or time.monotonic() - last_line >= every_s:
                emit(f"waiting for resources: {needed.describe()}, the cluster lacks {', '.join(short)} "
                     f"({waited:.0f} s of {timeout_s:g} s --resource-timeout)")
                last_line = time.monotonic()
            time.sleep(min(poll_s, max(0.0, timeout_s - waited)))
    finally:
        if requested:
            _request_bundles([])  # withdrawn: the cells' own reservations keep the nodes busy from here


def _request_bundles(bundles: list[dict[str, float]]) -> bool:
    """Ask the connected cluster's autoscaler for ``bundles`` (``[]`` withdraws); False where Ray refuses
    (no autoscaler state to write to, e.g. a client connection)."""
    from ray.autoscaler.sdk import request_resources

    try:
        request_resources(bundles=bundles)
    except Exception as error:  # noqa: BLE001 - a cluster without an autoscaler just waits
        logging.getLogger(__name__).debug("request_resources(%s) failed: %s", bundles, error)
        return False
    return True


# ----------------------------------------------------------------------------- tracking and storage
def check_tracking(tracking: str | None, *, timeout_s: float = TRACKING_PROBE_TIMEOUT_S) -> str:
    """The resolved tracking URI, after one quick probe: a SQLite store's folder can be created and
    written, a server or database answers within ``timeout_s``. Nothing is written."""
    uri = resolve_tracking_uri(tracking)
    db = sqlite_path(uri)
    if db is not None:
        _check_writable_folder(db.parent, f"tracking: SQLite store {db}")
        if db.is_dir():
            raise PreflightError(f"tracking: SQLite store {db} is a directory (expected a database file)")
        return uri
    parsed = urlparse(uri)
    if parsed.scheme in ("http", "https"):
        _probe_http(uri, timeout_s)
    elif parsed.scheme.split("+")[0] in _DB_PORTS:
        _probe_tcp(uri, parsed.hostname, parsed.port or _DB_PORTS[parsed.scheme.split("+")[0]], timeout_s)
    return uri


def _check_writable_folder(folder: Path, what: str) -> None:
    """The nearest existing ancestor of ``folder`` must be a writable directory (nothing is created)."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise PreflightError(f"{what}: cannot create or write {folder} ({existing} is not a writable directory)")


def _probe_http(uri: str, timeout_s: float) -> None:
    try:
        urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout_s).close()
    except urllib.error.HTTPError:
        return  # it answered (e.g. 401 behind basic auth): reachable
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise PreflightError(f"tracking: MLflow server {uri} did not answer within {timeout_s:g} s ({reason}); "
                             "expected a running tracking server (or leave --tracking unset for ./mlruns.db)") from None


def _probe_tcp(uri: str, host: str | None, port: int, timeout_s: float) -> None:
    try:
        socket.create_connection((host or "localhost", port), timeout=timeout_s).close()
    except OSError as error:
        shown = uri.split("@")[-1]  # never print credentials
        raise PreflightError(f"tracking: database {shown} did not answer within {timeout_s:g} s ({error}); "
                             "expected a running database server") from None


def check_storage(storage: str | os.PathLike | Storage | None, wait_s: float = 0.0) -> Storage:
    """The parsed checkpoint storage, reachable and writable (``PreflightError`` naming it otherwise);
    an unreachable S3 store is tried again for ``wait_s`` seconds (a store restarting)."""
    try:
        location = parse_storage(storage)
        location.check(wait_s=wait_s)
    except PreflightError:
        raise
    except ValueError as error:
        raise PreflightError(str(error)) from None
    return location


# ----------------------------------------------------------------------------- one host or several
def node_hosts(nodes: Iterable[Mapping[str, Any]]) -> list[str]:
    """The distinct hosts of the alive nodes among ``nodes`` (records as ``ray.nodes()`` gives them),
    sorted: a node's ``NodeManagerAddress`` (its IP), else its ``NodeManagerHostname``. Several
    raylets on one machine share their address, so they count once."""
    hosts = set()
    for node in nodes:
        if not node.get("Alive", True):
            continue
        host = node.get("NodeManagerAddress") or node.get("NodeManagerHostname")
        if host:
            hosts.add(str(host))
    return sorted(hosts)


def ray_nodes() -> list[dict[str, Any]]:
    """The connected Ray cluster's node records (``ray.nodes()``); none when Ray is not running here
    (the embedded default will then be a cluster on this machine only)."""
    return list(ray.nodes()) if ray.is_initialized() else []


def shared_filesystem_declared(shared: bool | None = None) -> bool:
    """``shared`` when given, else whether ``NPSEMISEG_SHARED_FILESYSTEM`` says yes (1, true, yes)."""
    if shared is not None:
        return shared
    return os.environ.get(SHARED_FILESYSTEM_ENV, "").strip().lower() in ("1", "true", "yes")


def node_local_tracking(uri: str) -> str | None:
    """What makes tracking URI ``uri`` a store only this host reaches (a SQLite file, a ``file:``
    folder), or None for a server or database."""
    db = sqlite_path(uri)
    if db is not None:
        return f"SQLite file {db}"
    if urlparse(uri).scheme == "file":
        return f"folder {urlparse(uri).path}"
    return None


def check_one_host_stores(tracking_uri: str, storage: str | os.PathLike | Storage | None, *, hosts: Iterable[str],
                          shared: bool | None = None) -> None:
    """On a cluster of more than one host (``hosts``: :func:`node_hosts`), ``PreflightError`` when the
    tracking store or the checkpoint storage is a path on this machine, unless the filesystem is
    declared shared (``shared``, else ``NPSEMISEG_SHARED_FILESYSTEM``). A storage that does not parse
    is left to :func:`check_storage`."""
    hosts = list(hosts)
    if len(hosts) < 2 or shared_filesystem_declared(shared):
        return
    cluster = f"the Ray cluster's nodes are on {len(hosts)} hosts ({', '.join(hosts[:3])}{', ...' if len(hosts) > 3 else ''})"
    declare = f"or --shared-filesystem ({SHARED_FILESYSTEM_ENV}=1) when every node mounts that path, e.g. over NFS"
    local = node_local_tracking(tracking_uri)
    if local is not None:
        raise PreflightError(f"tracking: {tracking_uri} is a {local} only this host reaches, but {cluster}; "
                             f"expected a tracking server (http://...) or database every node reaches, {declare}")
    try:
        location = parse_storage(storage)
    except ValueError:
        return
    if location.is_local:
        raise PreflightError(f"storage: {location.uri} is a directory only this host reaches, but {cluster}; "
                             f"expected s3://bucket/prefix, {declare}")


# ----------------------------------------------------------------------------- all of them
def preflight(configs: Iterable[RunConfig], needed: Needed, *, tracking: str | None,
              storage: str | os.PathLike | Storage | None, resource_timeout: float = RESOURCE_TIMEOUT_S,
              ray_init: Mapping[str, Any] | None = None, emit: Callable[[str], None] = _progress,
              storage_wait_s: float = 0.0, shared_filesystem: bool | None = None,
              nodes: Callable[[], Iterable[Mapping[str, Any]]] | None = None) -> tuple[str, Storage]:
    """Every check above, in order (data, weights, resources, tracking, one host, storage); returns the
    tracking URI and the storage. Raises :class:`PreflightError` at the first failure. ``nodes``: the
    cluster's node records, read once resources are there (default :func:`ray_nodes`; a test passes nodes
    of several hosts); ``shared_filesystem``: local paths are reachable from every node (None:
    ``NPSEMISEG_SHARED_FILESYSTEM``)."""
    configs = list(configs)
    check_data(configs)
    check_weights(configs)
    check_resources(needed, resource_timeout=resource_timeout, ray_init=ray_init, emit=emit)
    uri = check_tracking(tracking)
    check_one_host_stores(uri, storage, hosts=node_hosts((nodes or ray_nodes)()), shared=shared_filesystem)
    return uri, check_storage(storage, storage_wait_s)
