"""The ``npsemiseg`` command line: one typer app (:mod:`.app`), one module per command registering
itself on it (:mod:`.run`, :mod:`.grid`, :mod:`.search`, :mod:`.tables`, :mod:`.ui`,
:mod:`.hparams_figure`, :mod:`.sweep_orphans`, :mod:`.stack`), and :mod:`.main`, which imports
them all (the console script and ``jobs/``). Errors the user can fix print one line,
``error: ...``, and exit with status 2 before anything starts.
"""
