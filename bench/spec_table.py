"""The ratio table of bench/gpu/gpu_speculation.sh from the bench JSONs under OUT (its own file so
that a run cut short by a time limit still prints what it measured)."""

import collections
import glob
import json
import sys

out = sys.argv[1]
tps = collections.defaultdict(list)
extra = {}
for path in glob.glob(f"{out}/spec-*-*-*.json"):
    scenario, mode, _ = path.rsplit("/", 1)[1][5:-5].rsplit("-", 2)
    with open(path) as f:
        rows = json.load(f)["rows"]
    for row in rows:
        tps[(scenario, row["concurrency"], mode)].append(row["output_tok_s"])
        if mode == "ngram":
            extra[(scenario, row["concurrency"])] = (
                row.get("spec_acceptance"),
                row.get("tokens_per_forward"),
            )
print(
    f"{'scenario':8} {'conc':>4} {'off tok/s':>10} {'ngram tok/s':>12} {'ratio':>6} "
    f"{'accept':>7} {'tok/fwd':>7}"
)
for scenario, conc in sorted(extra):
    off = sum(tps[(scenario, conc, "off")]) / len(tps[(scenario, conc, "off")])
    on = sum(tps[(scenario, conc, "ngram")]) / len(tps[(scenario, conc, "ngram")])
    acc, tpf = extra[(scenario, conc)]
    print(
        f"{scenario:8} {conc:>4} {off:>10.1f} {on:>12.1f} {on / off:>6.2f} {acc or 0:>7.2f} "
        f"{tpf or 0:>7.2f}"
    )
