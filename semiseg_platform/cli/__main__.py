"""``python -m semiseg_platform.cli ...``: the ``npsemiseg`` console script without the installed script."""

from semiseg_platform.cli.main import main

main()
