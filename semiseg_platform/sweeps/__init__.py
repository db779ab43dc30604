"""Sweeps: many cells as Ray Tune trials under one MLflow parent run, a grid's or a search's.

- :mod:`.spec_base`: what the grid and search specs share (the strict model base, reading YAML,
  one-line errors, the per-cell :class:`~.spec_base.Resources` and what they reserve);
- :mod:`.grid_spec`: a grid's spec and its expansion into the cells' RunConfigs;
- :mod:`.search_spec`: a search's spec (one cell, a space, the sampler, ASHA) and its ``search_id``;
- :mod:`.search_study`: the Optuna side of a search (the seeded TPE searcher, the study's best configuration);
- :mod:`.submission`: what running a grid and a search share (submission, parent run, the Tuner,
  progress, reconciliation with MLflow, the summary on the parent run);
- :mod:`.grid_runner`: :func:`~.grid_runner.run_grid`; :mod:`.search_runner`: :func:`~.search_runner.run_search`.

Importing this package imports none of them (nor Ray, Optuna or MLflow).
"""
