"""A checkpoint of the NP-SemiSeg authors' U2PL run evaluated by their ``validate`` and by the project's evaluation path.

What is evaluated and how: ``benchmarks/official/np_evaluation.py`` (its docstring); this is its command.

    python benchmarks/official_np_evaluation.py --official-root ROOT --seed S --checkpoint CKPT --out DIR
"""

from __future__ import annotations

from official.np_evaluation import main

if __name__ == "__main__":
    main()
