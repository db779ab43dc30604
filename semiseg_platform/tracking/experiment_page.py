"""What a study's experiment shows in the MLflow UI: its kind, its description and a saved view of its cells.

MLflow 3.17's UI (its JS bundle, ``mlflow/server/js/build/static/js``) reads, for an experiment:

- the experiment tag ``mlflow.experimentKind`` (values ``genai_development`` | ``custom_model_development``
  | ...): the experiment's kind, which its header and side navigation follow where the UI's "workflow type"
  switcher is off; in 3.17 the switcher is on (the feature flag ``Z0`` of module ``89511`` returns true), so the
  view is chosen by the URL's ``workflowType=genai|machine_learning`` (module ``7975``; without it the browser's
  remembered choice, GenAI by default). The tag still says what the experiment is, for the UIs that read it;
- the experiment tag ``mlflow.note.content``: the description shown under the experiment's name;
- experiment tags ``mlflow.sharedViewState.<id>``: saved views of the runs table, listed in its **Views** menu
  and opened by the URL parameter ``viewStateShareKey=<id>`` (module ``53787``: the value is the JSON envelope
  ``{name, createdAt, updatedAt, state}``, ``state`` a JSON string, optionally ``deflate;``-compressed). The
  state holds the search (``searchFilter``, ``orderByKey``, ``orderByAsc``: the same keys the URL takes, module
  ``57637``) and the table's layout (``selectedColumns``: the only way to choose columns, no URL parameter
  does); a URL that carries any search key ignores the view. Opened on the cells' view, the table lists the
  cell runs themselves, not nested under their parent run (``tests/test_ui_mlflow.py`` checks it).

Column and sort keys are ``<type>.`<key>``` (``metrics.`miou```, ``tags.`framework```: MLflow's
``makeCanonicalSortKey``, module ``95051``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from mlflow import MlflowClient
from mlflow.entities import Experiment

from semiseg_platform.tracking import mlflow_names

#: The saved view of every cell run (id: (name, search filter)): the view every study's experiment carries
CELL_FILTER = f"tags.`{mlflow_names.KIND}` = '{mlflow_names.KIND_CELL}'"
CELLS_VIEW, CELLS_VIEW_NAME = "npsemiseg-cells", "Cells by mIoU"
#: the same cells, best calibrated (lowest ECE) first, with the reliability metrics as columns
ECE_VIEW, ECE_VIEW_NAME = "npsemiseg-cells-by-ece", "Cells by ECE"
CELLS_VIEWS = {CELLS_VIEW: (CELLS_VIEW_NAME, CELL_FILTER), ECE_VIEW: (ECE_VIEW_NAME, CELL_FILTER)}
#: the final metrics a view shows as columns, before the cell's axes
VIEW_METRICS = ("miou", "pavpu", "ece")
#: per view that is not ordered by mIoU: (the metric it sorts by, ascending, its metric columns)
VIEW_ORDERS = {ECE_VIEW: ("ece", True, ("ece", "ece_adaptive", "nll", "brier", "auroc", "aupr", "aurc", "miou"))}
#: the views' fixed ``createdAt``, so that writing a view again changes nothing
_VIEW_CREATED_MS = 0


def column_key(kind: str, key: str) -> str:
    """A runs-table column or sort key: ``metrics.`miou```, ``tags.`framework```."""
    return f"{kind}.`{key}`"


def view_state(search_filter: str, view: str = CELLS_VIEW) -> dict:
    """A runs table listing ``search_filter``'s runs, best final mIoU first, with the final mIoU, PAvPU and
    ECE and the cell's axes as columns; a view of :data:`VIEW_ORDERS` sorts by and shows its own metrics."""
    order, ascending, metrics = VIEW_ORDERS.get(view, ("miou", False, VIEW_METRICS))
    columns = [column_key("metrics", metric) for metric in metrics]
    columns += [column_key("tags", tag) for tag in (*mlflow_names.CELL_KEYS, mlflow_names.PROTOCOL)]
    return {"searchFilter": search_filter, "orderByKey": column_key("metrics", order), "orderByAsc": ascending,
            "selectedColumns": columns}


def view_tags(views: Mapping[str, tuple[str, str]]) -> dict[str, str]:
    """The experiment tags of saved views ``{id: (name, search filter)}``: MLflow's envelope around each
    :func:`view_state`."""
    return {mlflow_names.SAVED_VIEW_PREFIX + view: json.dumps({
        "name": name, "createdAt": _VIEW_CREATED_MS, "updatedAt": _VIEW_CREATED_MS,
        "state": json.dumps(view_state(search, view))}) for view, (name, search) in views.items()}


def experiment_description(experiment: str) -> str:
    """What the study's experiment holds and where its tables and claims are (Markdown)."""
    metrics = ", ".join(f"`{metric}`" for metric in mlflow_names.FINAL_METRICS)
    return "\n".join([
        f"**{experiment}**: npsemiseg cell runs, one per framework x dataset x partition x head "
        "(`{framework}/{dataset}/{partition}/{head}/{protocol}`), each a child of its submission's parent run "
        "(`grid/<spec>` or `search/<spec>`: expand it to see its cells).",
        "",
        f"A cell's final metrics: {metrics} (per evaluation under `eval/`); its figures under `figures/`. "
        f"The view **{CELLS_VIEW_NAME}** (Views menu) lists every cell run with its mIoU, PAvPU and ECE, best mIoU first; "
        f"**{ECE_VIEW_NAME}** lists them best calibrated first, with the reliability metrics (docs/uncertainty.md).",
        "",
        "The paper's tables and the claims report: artifacts `tables/` and `claims/claims.md` of each grid's "
        f"parent run; rebuilt from this store by `npsemiseg tables --experiment {experiment} --out DIR` and "
        f"`npsemiseg claims --experiment {experiment}`.",
    ])


def experiment_tags(experiment: str, views: Mapping[str, tuple[str, str]] = CELLS_VIEWS) -> dict[str, str]:
    """The tags a study's experiment carries for the UI: kind, description, saved ``views`` (:func:`view_tags`)."""
    return {mlflow_names.EXPERIMENT_KIND: mlflow_names.EXPERIMENT_KIND_TRAINING,
            mlflow_names.NOTE: experiment_description(experiment), **view_tags(views)}


def describe_experiment(client: MlflowClient, experiment: Experiment,
                        views: Mapping[str, tuple[str, str]] = CELLS_VIEWS) -> None:
    """Give an existing experiment the tags of :func:`experiment_tags` it lacks or has outdated (stores written
    before them); a description someone wrote in the UI is kept. Writes nothing when they are up to date."""
    for key, value in experiment_tags(experiment.name, views).items():
        current = experiment.tags.get(key)
        if current != value and not (key == mlflow_names.NOTE and current):
            client.set_experiment_tag(experiment.experiment_id, key, value)
