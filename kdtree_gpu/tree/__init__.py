"""The kd-tree: its arrays (:mod:`.kdtree`), file format (:mod:`.io`),
invariants and statistics (:mod:`.check`) and comparison (:mod:`.compare`).

Every builder makes a :class:`KdTree`; every consumer (ray queries, the
path tracer, the command line) reads one.
"""

from .check import check_tree, tree_stats, walk_levels
from .compare import compare_trees
from .io import TreeFileError, read_header
from .kdtree import KdTree, load_tree

__all__ = ["KdTree", "TreeFileError", "check_tree", "compare_trees", "load_tree", "read_header",
           "tree_stats", "walk_levels"]
