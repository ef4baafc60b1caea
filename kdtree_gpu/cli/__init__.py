"""The ``kdtree-gpu`` command-line tool (also ``python -m kdtree_gpu``).

Commands (one module each)
--------------------------
``build``   meshes to tree files, with one line of statistics per mesh
``info``    statistics, settings and file facts of a saved tree
``verify``  builds with the pipeline and the CPU reference, compares, checks,
            casts random rays against brute force; prints PASS or FAIL
``render``  path-traces a mesh or a built-in scene to a PNG
``bench``   a quick benchmark table (build time per builder, rays/s)
``demo``    builds, traces and renders the Cornell box; works without a GPU

:mod:`.parser` holds the options and help texts, :mod:`.common` what the
commands share. The commands are thin: the work is the library's
(``kd.build``, ``load_mesh``, ``load_tree``, the ray queries, the renderer,
:mod:`kdtree_gpu.testing` for ``verify``'s rays and comparison).

Errors are one line ``kdtree-gpu: error: ...`` on stderr; ``--debug`` shows
the traceback instead.

Exit status
-----------
``0``    success
``1``    the work failed: a mesh of a batch did not build (the others did),
         ``verify`` says FAIL, ``info --check`` finds a broken invariant,
         ``demo``'s rays disagree with brute force, an unexpected error
``2``    a usage or input error: a bad option or option value, a missing
         file, a mesh that cannot be read or built (given alone), a tree file
         that does not load, an output that cannot or may not be written,
         ``--device`` naming a GPU that is not there
``130``  interrupted
"""

from __future__ import annotations

from .common import EXIT_INTERRUPTED, EXIT_USAGE, describe_error, exit_status, print_error

__all__ = ["main"]


def main(argv=None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``).

    Returns
    -------
    int
        The exit status (see the module docstring).
    """
    from .parser import build_parser

    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    args.debug = getattr(args, "debug", False)
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        print_error("interrupted")
        return EXIT_INTERRUPTED
    except Exception as exc:
        if args.debug:
            raise
        print_error(describe_error(exc))
        return exit_status(exc)
