"""The NP-SemiSeg authors' U2PL loop and the project's step in lockstep, iteration by iteration.

What is recorded, injected and compared: ``benchmarks/official/lockstep.py`` (its docstring); this is its command.

    python benchmarks/official_lockstep.py --official-root ROOT --steps 45 --out DIR
"""

from __future__ import annotations

from official.lockstep import main

if __name__ == "__main__":
    main()
