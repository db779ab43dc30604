"""The paper's tables and figures, built from MLflow runs only (never from local files).

- :mod:`.tables`: reading the cell runs and building Tables 1-6 as long frames;
- :mod:`.rendering`: Markdown, LaTeX, CSV and Parquet; :func:`write_report` (``npsemiseg tables``);
- :mod:`.figures`: :func:`line_panels`, the uncertainty-time figure and the hyper-parameter figure;
- :mod:`.reliability`: the reliability table of each dataset x partition (uncertainty quality, beside Tables 1-6);
- :mod:`.claims`: the claims report (``npsemiseg claims``), drawn as a forest plot by :mod:`.claims_figure`.
"""

from semiseg_platform.reports.figures import (
                                              PAPER_PANELS,
                                              UNCERTAINTY_TIME_BENCHMARK,
                                              UNCERTAINTY_TIME_METRIC,
                                              hparams_figure,
                                              line_panels,
                                              load_search_trials,
                                              load_uncertainty_times,
                                              log_uncertainty_time_run,
                                              profile,
                                              uncertainty_time_figure,
                                              write_hparams_figure,
)
from semiseg_platform.reports.paper_results import paper_results, paper_value
from semiseg_platform.reports.rendering import (
                                              format_cell,
                                              format_versus_paper,
                                              has_paper_values,
                                              layout,
                                              markdown_report,
                                              protocols_side_by_side,
                                              to_latex,
                                              to_markdown,
                                              write_report,
                                              write_tables,
)
from semiseg_platform.reports.reliability import (
                                              RELIABILITY_COLUMNS,
                                              RELIABILITY_METRICS,
                                              reliability_tables,
                                              with_reliability_tables,
)
from semiseg_platform.reports.tables import (
                                              ABLATION_FRAMEWORK,
                                              ABLATION_HEADS,
                                              CELL_KEYS,
                                              COMPANION_FRAMEWORKS,
                                              MISSING_MARK,
                                              PAPER_DATASETS,
                                              PAPER_FRAMEWORKS,
                                              PAPER_HEADS,
                                              build_table,
                                              build_tables,
                                              dataset_label,
                                              framework_label,
                                              head_label,
                                              latest_per_cell,
                                              load_cell_runs,
                                              method_label,
                                              paper_table_specs,
                                              protocol_groups,
                                              protocol_partitions,
                                              table_frameworks,
)

__all__ = [
    "ABLATION_FRAMEWORK", "ABLATION_HEADS", "CELL_KEYS", "COMPANION_FRAMEWORKS", "MISSING_MARK", "PAPER_DATASETS",
    "PAPER_FRAMEWORKS",
    "PAPER_HEADS", "PAPER_PANELS", "UNCERTAINTY_TIME_BENCHMARK", "UNCERTAINTY_TIME_METRIC", "build_table",
    "build_tables", "dataset_label", "format_cell", "format_versus_paper", "framework_label", "has_paper_values",
    "head_label", "hparams_figure", "latest_per_cell", "layout", "line_panels", "load_cell_runs",
    "load_search_trials", "load_uncertainty_times", "log_uncertainty_time_run", "markdown_report", "method_label",
    "paper_results", "paper_table_specs", "paper_value", "profile", "protocol_groups", "protocol_partitions",
    "protocols_side_by_side", "RELIABILITY_COLUMNS", "RELIABILITY_METRICS", "reliability_tables",
    "with_reliability_tables", "to_latex", "to_markdown", "uncertainty_time_figure", "write_hparams_figure",
    "table_frameworks", "write_report", "write_tables",
]
