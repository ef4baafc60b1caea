"""``python -m kdtree_gpu``: the same command-line tool as ``kdtree-gpu``."""

from .cli import main

raise SystemExit(main())
