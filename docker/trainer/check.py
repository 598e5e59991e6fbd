"""The compose demo's last step: reads what every rank read (rank-R.json in a
results directory, written by rank.py --results) and checks that each epoch gave
every sample of the dataset to exactly one rank.

    check.py DIR WORLD SAMPLES

SAMPLES is the dataset's sample count; an epoch leaves out SAMPLES % WORLD samples
(an equal share per rank), so that many may be missing. Prints one line per epoch and
exits 0 when every epoch is exact, 1 otherwise.
"""

import collections
import json
import os
import sys


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: check.py DIR WORLD SAMPLES")
    src, world, samples = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    ranks = []
    for r in range(world):
        with open(os.path.join(src, f"rank-{r}.json")) as f:
            ranks.append(json.load(f))
    epochs = sorted({int(e) for r in ranks for e in r["epochs"]})
    ok = bool(epochs)
    for e in epochs:
        counts = collections.Counter(k for r in ranks for k in r["epochs"].get(str(e), []))
        per_rank = [len(r["epochs"].get(str(e), [])) for r in ranks]
        twice = sum(1 for n in counts.values() if n > 1)
        want = samples - samples % world
        exact = twice == 0 and len(counts) == want and sum(per_rank) == want
        ok = ok and exact
        print(f"epoch {e}: {world} ranks read {sum(per_rank)} samples ({' + '.join(map(str, per_rank))}), "
              f"{len(counts)} distinct of {samples}, {twice} read twice: "
              + ("every sample exactly once" if exact else "NOT EXACT"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
