"""What the two sides of ``--framework np_u2pl`` draw over a whole run, without training, compared as distributions.

What is drawn and compared: ``benchmarks/official/draws.py`` (its docstring); this is its command.

    python benchmarks/official_draws.py --official-root ROOT --data-seed 0 --seed 0 --out DIR   # DIR/draws.json
"""

from __future__ import annotations

from official.draws import main

if __name__ == "__main__":
    main()
