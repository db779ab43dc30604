"""Whole official training runs on the mini-study's data, beside the project's cell with the same settings.

The runs, their patches and settings: ``benchmarks/official/`` (its ``__init__``'s docstring); this is its command.

    python benchmarks/official_runs.py --official-root ROOT --framework unimatch --data-seed 7919 --seeds 0 1 --out DIR
    python benchmarks/official_runs.py --combine A/official_runs.json B/official_runs.json --out D
    python benchmarks/official_runs.py --figure curves.png --combine D/official_runs.json
"""

from __future__ import annotations

from official.cli import main

if __name__ == "__main__":
    main()
