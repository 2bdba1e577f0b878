#!/usr/bin/env bash
# The README's long "Using it" lines, run as written on a fresh clone before a release (tests/
# test_readme_commands.py runs the quick ones in every `make test` and checks that this script names the rest).
# About an hour on 2 CPU cores; needs apt for the corpus. Run from the repository root after `make setup`.
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fastvocab --help > /dev/null
fastvocab corpus -o data/corpus
fastvocab corpus --catalogs -o data/catalogs
fastvocab train-demo --preset tiny --max-steps 20 --work-dir "$tmp/train-demo"
fastvocab run configs/demo.yaml
fastvocab report latest -o "$tmp/report.html"
# the bulk line reads a Parquet dataset with a text column: the test split's sources
python - "$tmp" <<'PY'
import sys
from pathlib import Path
import pyarrow as pa, pyarrow.parquet as pq
from fastvocab.artifacts_schema.corpus import read_direction
_, src, _ = read_direction("data/corpus", "en", "it", "test", limit=200)
out = Path(sys.argv[1]) / "corpus"
out.mkdir()
pq.write_table(pa.table({"text": src}), out / "part-0.parquet")
PY
(cd "$tmp" && ln -s "$OLDPWD/models" models && \
    fastvocab translate --src-lang en --tgt-lang it -i 'corpus/*.parquet' -o out/ --workers 4)
fastvocab corpus -o data/pool --languages en,fr,es
fastvocab experiment paper --quick --pool-corpus data/pool
# decoding as the demo config does (probes 4, the shipped shortlist), the demo run's maps meet the budget
fastvocab tune --src-lang en --tgt-lang it --with-shortlist models/demo-maps --probes 4 --budget 5% --rungs 30,200
fastvocab tune --src-lang en --tgt-lang it --beam 4 --with-shortlist models/demo-maps --probes 4 --budget 8% --rungs 30,200
echo "release check: every long README line ran"
