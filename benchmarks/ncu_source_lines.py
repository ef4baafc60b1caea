"""Where a kernel's warps stall and what they execute, CUDA line by line, from Nsight Compute.

Profile with the SourceCounters section (the package compiles with ``-lineinfo``), then
export the source page with CUDA lines and their SASS correlated. NVRTC records each
source by its bare file name, so run the export from a folder that holds the sources
under those names (the repository root with ``kdtree_gpu/cuda/*.cu*`` copied beside it)::

    ncu --clock-control none -k regex:kd_build_small_levels --launch-skip 1 --launch-count 1 \\
        --section SourceCounters --section WarpStateStats -o small python SCRIPT
    ncu -i small.ncu-rep --page source --csv --print-source cuda,sass > small.csv
    python benchmarks/ncu_source_lines.py small.csv [TOP]

Prints the share of stall samples and of executed instructions per source file, the
stall reasons over the whole kernel, and the TOP lines (default 25) by stall samples with
their leading stall reasons.
"""
import collections
import csv
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
INSTRUCTIONS = "Instructions Executed"


def lines(path):
    """(file, line, source, {metric: value}) for every CUDA line of the export."""
    name, header = None, None
    for row in csv.reader(open(path, errors="replace")):
        if not row:
            continue
        if row[0] == "File Path":
            name = row[1].rsplit("/", 1)[-1]
        elif row[0] == "Line No":
            header = row
        elif row[0] not in ("", "Function Name") and header is not None:
            values = {}
            for key, text in zip(header, row):
                try:
                    values[key] = float(text)
                except ValueError:
                    pass
            yield name, int(row[0]), row[1].strip(), values


def main():
    rows = list(lines(sys.argv[1]))
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 25
    samples = sum(v.get(SAMPLES, 0) for *_, v in rows) or 1
    executed = sum(v.get(INSTRUCTIONS, 0) for *_, v in rows) or 1
    print(f"{len(rows)} lines, {samples:.0f} stall samples, {executed:.4g} instructions")
    files = collections.defaultdict(lambda: [0.0, 0.0])
    reasons = collections.Counter()
    for name, _, _, v in rows:
        files[name][0] += v.get(SAMPLES, 0)
        files[name][1] += v.get(INSTRUCTIONS, 0)
        for key, x in v.items():
            if key.startswith("stall_") and "Not Issued" not in key:
                reasons[key[6:]] += x
    for name, (s, i) in sorted(files.items(), key=lambda kv: -kv[1][0]):
        print(f"  {name:24s} {100 * s / samples:5.1f}% of samples {100 * i / executed:5.1f}% "
              f"of instructions")
    print("stall reasons: " + ", ".join(f"{k} {100 * x / samples:.1f}%"
                                        for k, x in reasons.most_common(8)))
    print(f"top {top} lines by stall samples (% samples, % instructions, leading reasons):")
    for name, line, source, v in sorted(rows, key=lambda r: -r[3].get(SAMPLES, 0))[:top]:
        lead = sorted(((k[6:], x) for k, x in v.items()
                       if k.startswith("stall_") and "Not Issued" not in k and x > 0),
                      key=lambda kv: -kv[1])[:2]
        share = v.get(SAMPLES, 0) or 1
        why = ", ".join(f"{k} {100 * x / share:.0f}%" for k, x in lead)
        print(f"  {100 * v.get(SAMPLES, 0) / samples:5.1f} {100 * v.get(INSTRUCTIONS, 0) / executed:5.1f}"
              f"  {name}:{line:<5} {source[:80]}  [{why}]")


if __name__ == "__main__":
    main()
